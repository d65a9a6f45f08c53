"""The processes a guarded check's step starts: multiprocessing's, recorded as they start,
and any child of this process, by pid (see :mod:`trainlint._runtime.guard`). No torch here.
"""

from __future__ import annotations

import os
import threading
from multiprocessing.process import BaseProcess
from typing import Any

# The guards running (in any thread): the multiprocessing processes started are theirs.
# BaseProcess's start is replaced while a guard runs, and its terminate and kill from the
# first process started under a guard (the step can only stop what was started, and most
# steps start none: two class attributes set and put back a check, not six); the first
# guard to start puts ours on, the last to end puts the originals back, and no check leaves
# multiprocessing patched after it (leaving them on would save ~5 us a check).
_RUNNING: list[Any] = []
_RUNNING_LOCK = threading.Lock()
_ORIGINAL: dict[str, Any] = {}


def _start(process: Any) -> None:
    _ORIGINAL["start"](process)
    with _RUNNING_LOCK:
        if _RUNNING:  # (a wrapper left around ours may call it after the last guard)
            _patch("terminate")
            _patch("kill")
        running = list(_RUNNING)
    for guard in running:
        guard.processes.append(process)


def _terminate(process: Any) -> None:
    for guard in list(_RUNNING):
        guard.stopped_by_step.add(id(process))
    _ORIGINAL["terminate"](process)


def _kill(process: Any) -> None:
    for guard in list(_RUNNING):
        guard.stopped_by_step.add(id(process))
    _ORIGINAL["kill"](process)


_REPLACEMENTS = {"start": _start, "terminate": _terminate, "kill": _kill}


def _patch(name: str) -> None:
    """Put ours on the original (one that wraps ours, left on, stays: ours under it still
    records). Called holding _RUNNING_LOCK."""
    replacement = _REPLACEMENTS[name]
    current = getattr(BaseProcess, name)
    if current is not replacement and (name not in _ORIGINAL or current is _ORIGINAL[name]):
        _ORIGINAL[name] = current
        setattr(BaseProcess, name, replacement)


def track_processes(guard: Any) -> None:
    with _RUNNING_LOCK:
        _patch("start")
        _RUNNING.append(guard)


def untrack_processes(guard: Any) -> None:
    with _RUNNING_LOCK:
        _RUNNING.remove(guard)
        if not _RUNNING:
            for name, replacement in _REPLACEMENTS.items():
                if getattr(BaseProcess, name) is replacement:  # (one wrapping ours stays)
                    setattr(BaseProcess, name, _ORIGINAL[name])


def _has_children() -> bool:
    """Whether this process has a child, by one system call that changes nothing (a zombie
    stays for its owner to reap): most have none, and reading /proc cost ~40 us a check."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return True
    try:
        waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    except OSError:
        return True
    return True


def _child_pids() -> list[int]:
    """This process's children, from /proc where it lists them (Linux); else none. Raw
    ``os.open``/``os.read``: ``open()``'s text layer was most of its cost."""
    pids: list[int] = []
    base = f"/proc/{os.getpid()}/task"
    try:
        tasks = os.listdir(base)
    except OSError:
        return pids
    for task in tasks:
        try:
            fd = os.open(f"{base}/{task}/children", os.O_RDONLY)
        except OSError:
            continue
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
        except OSError:
            continue
        finally:
            os.close(fd)
        pids += [int(p) for p in data.split()]
    return pids
