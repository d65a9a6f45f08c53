"""The timeout of a guarded check: a deadline that stops the checking thread, and the stacks.

In the main thread the deadline is a ``SIGALRM`` timer, whose handler can interrupt a
blocking wait (a join, a lock, a pipe read). Off the main thread, or when someone else
(pytest-timeout) has an alarm running, a watchdog thread raises :class:`StepTimedOut`
into the checking thread instead. No torch here.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

try:  # the C functions under `signal`: its wrappers convert handlers to enums, and a
    # Python handler is converted by raising and catching ValueError, twice per check
    from _signal import signal as _set_handler
except ImportError:  # pragma: no cover - not CPython
    _set_handler = signal.signal

_ITIMER = hasattr(signal, "setitimer")
# plain ints and the C function: an enum argument is converted on every call
_SIGALRM = int(getattr(signal, "SIGALRM", 14))
_ITIMER_REAL = int(getattr(signal, "ITIMER_REAL", 0))
_setitimer: Any = getattr(signal, "setitimer", None)
# The guard's own frames (this module's and guard.py's) are left out of the stacks.
_GUARD_FILES = ("guard.py", "timeout.py")


class StepTimedOut(BaseException):
    """Raised into the checking thread when ``timeout`` expires.

    A BaseException so that a step's own ``except Exception`` does not swallow it.
    """


class Deadline:
    """Stops the thread that armed it with :class:`StepTimedOut`, ``timeout`` seconds after
    :meth:`arm`, first calling ``on_expire`` (in the thread the deadline fires in)."""

    __slots__ = ("_on_expire", "_alarm", "_previous", "_watchdog", "_target")

    def __init__(self, on_expire: Callable[[], None]) -> None:
        self._on_expire = on_expire
        self._alarm = False
        self._previous: Any = None
        self._watchdog: threading.Timer | None = None
        self._target = 0

    @property
    def watching(self) -> bool:
        """Whether a watchdog thread (not a signal) is armed: it runs ``on_expire``."""
        return self._watchdog is not None

    def arm(self, timeout: float) -> None:
        # In the main thread a signal interrupts a blocking wait (a join, a lock, a pipe
        # read), which an exception set from another thread cannot. Not when someone else
        # (pytest-timeout) has an alarm running: then theirs is put back as it was, and
        # the watchdog thread does it (told by what setitimer replaced: one system call
        # fewer than asking getitimer first).
        if _ITIMER:
            try:
                previous = _set_handler(_SIGALRM, self._on_alarm)
            except ValueError:  # not the main thread (whose signal handlers are)
                pass
            else:
                replaced = _setitimer(_ITIMER_REAL, timeout)
                if not replaced[0]:
                    self._alarm = True
                    self._previous = previous
                    return
                _setitimer(_ITIMER_REAL, *replaced)
                _set_handler(_SIGALRM, previous)
        self._target = threading.get_ident()
        self._watchdog = threading.Timer(timeout, self._on_watchdog)
        self._watchdog.daemon = True
        self._watchdog.name = "trainlint-timeout"
        self._watchdog.start()

    def disarm(self) -> None:
        if self._alarm:
            _setitimer(_ITIMER_REAL, 0)
            _set_handler(_SIGALRM, self._previous)
            self._alarm = False
            self._previous = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _on_alarm(self, signum: int, frame: Any) -> None:
        self._on_expire()
        raise StepTimedOut

    def _on_watchdog(self) -> None:
        self._on_expire()
        import ctypes

        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(self._target), ctypes.py_object(StepTimedOut)
        )


def all_stacks(skip: int | None = None) -> str:
    """Every thread's stack, innermost call last, as ``faulthandler`` would show them."""
    names = {t.ident: t.name for t in threading.enumerate()}
    blocks = []
    for ident, frame in sys._current_frames().items():
        if ident == skip:
            continue
        frames = traceback.extract_stack(frame)
        here = {
            os.path.realpath(os.path.join(os.path.dirname(__file__), name)) for name in _GUARD_FILES
        }
        frames = traceback.StackSummary.from_list(
            [f for f in frames if os.path.realpath(f.filename) not in here]
        )
        name = names.get(ident, f"thread {ident}")
        blocks.append(f"Thread {name!r} (most recent call last):\n" + "".join(frames.format()))
    return "\n".join(blocks)
