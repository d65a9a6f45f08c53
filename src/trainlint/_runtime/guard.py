"""What every check does around the user's steps: nothing swallowed, nothing hangs forever.

A step may start threads and processes. An exception raised in a thread goes to
``threading.excepthook``, which prints it and carries on: a threaded step whose workers
all crashed would pass. A child process that died with a non-zero exit code is as silent.
And a step whose workers deadlock would block the check, and the test run, forever.

:func:`guarded` wraps a check so that, for its duration, it

* installs a ``threading.excepthook`` that records exceptions raised in threads started
  during the check (the previous hook still runs, and is restored afterwards);
* records the ``multiprocessing`` processes started during the check, and their exit codes;
* arms a timer (``timeout=``, in seconds; see :mod:`trainlint._runtime.timeout`): on
  expiry it takes every thread's stack, terminates the processes started during the
  check, and stops the check.

A check that would otherwise pass then fails naming the thread or process and what it
raised; a check that failed anyway carries the same as a note. No torch here.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import signal
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from trainlint._runtime.lintlink import reset_ran
from trainlint._runtime.processes import (
    _child_pids,
    _has_children,
    track_processes,
    untrack_processes,
)
from trainlint._runtime.timeout import Deadline, StepTimedOut, all_stacks

DEFAULT_TIMEOUT = 120.0
# How long to wait at the end of a check for threads and processes the step started and
# left running, so that an exception they raise a moment later is not missed.
_GRACE = 1.0
_KILL_GRACE = 2.0

F = TypeVar("F", bound=Callable[..., Any])
# ident -> Thread (CPython's): a copy of its keys costs a fraction of threading.enumerate()
_ACTIVE: dict[int, Any] | None = getattr(threading, "_active", None)
_LOCK = threading.Lock()  # a guard's thread errors and expiry, written from other threads
_NO_PIDS: frozenset[int] = frozenset()
_monotonic = time.monotonic


@dataclass(frozen=True)
class ThreadError:
    thread: str
    error: BaseException
    where: str


@dataclass(frozen=True)
class ProcessExit:
    name: str
    pid: int | None
    exitcode: int


class Guard:
    """The state of one guarded check run (see the module docstring)."""

    __slots__ = (
        "check",
        "timeout",
        "thread_errors",
        "processes",
        "stopped_by_step",
        "expired",
        "stacks",
        "terminated",
        "_threads_before",
        "_children_before",
        "_previous_hook",
        "_deadline",
        "_started",
    )

    def __init__(self, check: str, timeout: float | None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.check = check
        self.timeout = timeout
        self.thread_errors: list[ThreadError] = []
        self.processes: list[Any] = []
        self.stopped_by_step: set[int] = set()
        self.expired = False
        self.stacks = ""
        self.terminated: list[str] = []
        self._children_before: set[int] | frozenset[int] = _NO_PIDS
        self._deadline: Deadline | None = None

    # ------------------------------------------------------------------ enter / exit

    def __enter__(self) -> Guard:
        self._started = _monotonic()
        # set(dict) copies in C, no thread switch halfway (a comprehension could raise)
        self._threads_before = (
            set(_ACTIVE)
            if _ACTIVE is not None
            else {t.ident for t in threading.enumerate() if t.ident}
        )
        if _has_children():
            self._children_before = set(_child_pids())
        self._previous_hook = threading.excepthook
        threading.excepthook = self._excepthook
        track_processes(self)
        if self.timeout is not None:
            self._deadline = deadline = Deadline(self._expire)
            deadline.arm(self.timeout)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._deadline is not None:
            self._deadline.disarm()
        try:
            # only when a thread or process started during the check may still run
            if not self.expired and (
                self.processes or _ACTIVE is None or not _ACTIVE.keys() <= self._threads_before
            ):
                self._wait_for_stragglers()
        finally:
            threading.excepthook = self._previous_hook  # type: ignore[assignment]
            untrack_processes(self)

    # ------------------------------------------------------------------ threads

    def _excepthook(self, args: Any) -> None:
        thread = args.thread
        if args.exc_type is not SystemExit and (
            thread is None or thread.ident not in self._threads_before
        ):
            name = thread.name if thread is not None else "<unknown thread>"
            error = args.exc_value if args.exc_value is not None else args.exc_type()
            with _LOCK:
                self.thread_errors.append(ThreadError(name, error, _user_frame(args.exc_traceback)))
        previous = self._previous_hook
        if previous is not None:
            previous(args)

    def _new_threads(self) -> list[threading.Thread]:
        if _ACTIVE is not None and _ACTIVE.keys() <= self._threads_before:
            return []  # no thread started during the check is still running
        current = threading.current_thread()
        return [
            t
            for t in threading.enumerate()
            if t.ident not in self._threads_before and t is not current and t.is_alive()
        ]

    def _wait_for_stragglers(self) -> None:
        deadline = time.monotonic() + _GRACE
        for thread in self._new_threads():
            thread.join(max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.join(max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------------ processes

    def process_exits(self) -> list[ProcessExit]:
        """Processes started during the check that exited non-zero on their own."""
        out = []
        for process in self.processes:
            if id(process) in self.stopped_by_step:
                continue
            code = process.exitcode
            if code not in (None, 0):
                out.append(ProcessExit(process.name, process.pid, code))
        return out

    # ------------------------------------------------------------------ timeout

    def _expire(self) -> None:
        with _LOCK:
            if self.expired:
                return
            self.expired = True
        watching = self._deadline is not None and self._deadline.watching
        self.stacks = all_stacks(skip=threading.get_ident() if watching else None)
        self.terminated = self._terminate_children()

    def _terminate_children(self) -> list[str]:
        done: list[str] = []
        alive = [p for p in self.processes if p.is_alive()]
        for process in alive:
            with contextlib.suppress(Exception):
                process.terminate()
                done.append(f"{process.name} (pid {process.pid})")
        deadline = time.monotonic() + _KILL_GRACE
        for process in alive:
            with contextlib.suppress(Exception):
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join(1.0)
        # Processes started another way (subprocess, os.fork): by pid.
        known = {p.pid for p in self.processes}
        for pid in _child_pids():
            if pid in self._children_before or pid in known:
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
                done.append(f"pid {pid}")
        return done

    def elapsed(self) -> float:
        return _monotonic() - self._started


def _user_frame(tb: Any) -> str:
    from trainlint._runtime.lintlink import display_path

    frames = [
        f
        for f in traceback.extract_tb(tb)
        if f"{os.sep}torch{os.sep}" not in f.filename and f"{os.sep}threading.py" not in f.filename
    ]
    if not frames:
        return ""
    frame = frames[-1]
    return f"{display_path(frame.filename)}:{frame.lineno} in {frame.name}"


def _first_step(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for key in ("step", "scheduler_factory"):
        if key in kwargs:
            return kwargs[key]
    for arg in args:
        if type(arg) is types.FunctionType:  # a plain function: its own attributes only
            if "named_parameters" not in arg.__dict__:  # (hasattr raised and caught: 1 us)
                return arg
        elif callable(arg) and not hasattr(arg, "named_parameters"):
            return arg
    return None


def guarded(check: str) -> Callable[[F], F]:
    """Run the decorated check under a :class:`Guard`; it reads the check's ``timeout=``."""

    def decorate(func: F) -> F:
        default = inspect.signature(func).parameters["timeout"].default

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            try:
                return checked(*args, **kwargs)
            finally:
                reset_ran()  # what this check's step ran is not the next check's

        def checked(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            guard = Guard(check, kwargs.get("timeout", default))
            try:
                with guard:
                    result = func(*args, **kwargs)
            except StepTimedOut:
                _report_timeout(guard, _first_step(args, kwargs))
            except BaseException as error:
                note = problems_text(guard)
                if note and hasattr(error, "add_note"):
                    error.add_note(note)
                raise
            if guard.thread_errors or (guard.processes and guard.process_exits()):
                _report_problems(guard, _first_step(args, kwargs))
            return result

        return wrapper  # type: ignore[return-value]

    return decorate


@contextlib.contextmanager
def guarding(check: str, timeout: float | None = DEFAULT_TIMEOUT) -> Iterator[Guard]:
    """:func:`guarded` as a context manager, for code that is not a check function."""
    with Guard(check, timeout) as guard:
        yield guard


def problems_text(guard: Guard) -> str:
    """What threads and processes started during the check raised or exited with."""
    lines = []
    for e in guard.thread_errors:
        text = f"{type(e.error).__name__}: {e.error}".rstrip(": ")
        if len(text) > 200:
            text = text[:197] + "..."
        lines.append(f"thread {e.thread!r} raised {text}" + (f" (at {e.where})" if e.where else ""))
    for p in guard.process_exits():
        how = (
            f"was killed by signal {-p.exitcode}"
            if p.exitcode < 0
            else f"exited with code {p.exitcode}"
        )
        lines.append(f"process {p.name!r} (pid {p.pid}) {how}")
    return "\n".join(lines)


def _report_problems(guard: Guard, step: Any) -> None:
    __tracebackhide__ = True
    from trainlint._runtime.report import fail

    n_threads = len(guard.thread_errors)
    n_procs = len(guard.process_exits())
    what = []
    if n_threads:
        what.append(f"{n_threads} thread" + ("s" if n_threads != 1 else "") + " raised")
    if n_procs:
        what.append(f"{n_procs} process" + ("es" if n_procs != 1 else "") + " exited with an error")
    fail(
        guard.check,
        "the step's measurements passed, but " + " and ".join(what),
        [
            problems_text(guard),
            "An exception in a thread is printed and otherwise ignored by Python, and a "
            "worker process that dies leaves no error in the parent: the step went on "
            "without that work. Join your workers and re-raise their errors.",
        ],
        sources=[step] if step is not None else [],
    )


def _report_timeout(guard: Guard, step: Any) -> None:
    __tracebackhide__ = True
    from trainlint._runtime.report import fail

    sections = [
        f"Every thread's stack at the timeout:\n{guard.stacks}",
    ]
    if guard.terminated:
        sections.append("Terminated the processes it started: " + ", ".join(guard.terminated))
    problems = problems_text(guard)
    if problems:
        sections.append(problems)
    sections.append(
        "A step that hangs is usually waiting on a worker that deadlocked or died: a "
        "process forked while another thread held a lock (use the 'spawn' start method), "
        "a queue read whose writer is gone, or a join on a worker that never ends."
    )
    fail(
        guard.check,
        f"the step did not finish within timeout={guard.timeout:g} s",
        sections,
        sources=[step] if step is not None else [],
    )
