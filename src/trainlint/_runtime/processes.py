"""The processes a guarded check's step starts: multiprocessing's, recorded as they start,
and any child of this process, by pid (see :mod:`trainlint._runtime.guard`). No torch here.
"""

from __future__ import annotations

import os
import threading
from multiprocessing import process
from multiprocessing.process import BaseProcess
from typing import Any

_process: Any = process  # its _children is not in the stubs

# The guards running (in any thread): the multiprocessing processes started are theirs.
# While a guard runs, multiprocessing's module-level set of live children is a _Tracked
# set, to which BaseProcess.start adds every process it starts (one module attribute set
# and put back a check: patching BaseProcess.start, a class attribute, invalidated the
# type caches of every Process class twice a check, ~10k instructions). BaseProcess's
# terminate and kill are replaced from the first process started under a guard (the step
# can only stop what was started). The first guard to start puts ours on, the last to end
# puts the originals back: no check leaves multiprocessing patched after it.
_RUNNING: list[Any] = []
_RUNNING_LOCK = threading.Lock()
_ORIGINAL: dict[str, Any] = {}
_ON: set[str] = set()  # BaseProcess methods replaced by ours since the first guard started


class _Tracked(set):  # type: ignore[type-arg]
    """multiprocessing's live children while a guard runs: each process ``start()`` adds
    is recorded into every running guard."""

    __slots__ = ()

    def add(self, process: Any) -> None:
        set.add(self, process)
        with _RUNNING_LOCK:
            if _RUNNING:  # (a set kept by someone past the last guard)
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


_REPLACEMENTS = {"terminate": _terminate, "kill": _kill}


def _patch(name: str) -> None:
    """Put ours on the original (one that wraps ours, left on, stays: ours under it still
    records). Called holding _RUNNING_LOCK."""
    replacement = _REPLACEMENTS[name]
    current = getattr(BaseProcess, name)
    if current is not replacement and (name not in _ORIGINAL or current is _ORIGINAL[name]):
        _ORIGINAL[name] = current
        setattr(BaseProcess, name, replacement)
        _ON.add(name)


def track_processes(guard: Any) -> None:
    with _RUNNING_LOCK:
        if not _RUNNING:
            children = _process._children
            if type(children) is not _Tracked:
                _ORIGINAL["children"] = children
                _process._children = _Tracked(children)
        _RUNNING.append(guard)


def untrack_processes(guard: Any) -> None:
    with _RUNNING_LOCK:
        _RUNNING.remove(guard)
        if _RUNNING:
            return
        tracked = _process._children
        original = _ORIGINAL.pop("children", None)
        if type(tracked) is _Tracked and original is not None:
            if tracked or original:  # the live children, as start() and join() left them
                original.clear()
                original.update(tracked)
            _process._children = original
        for name in _ON:  # terminate and kill, once a process started under a guard
            if getattr(BaseProcess, name) is _REPLACEMENTS[name]:  # (one wrapping ours stays)
                setattr(BaseProcess, name, _ORIGINAL[name])
        _ON.clear()


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
