"""Pausing the garbage collector around work whose objects all stay alive, shared by the
lint side and the runtime checks (no torch, nothing else imported)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection for the length of the block, when the collector is on (and left
    off when it was off): while a file's model or the project index is built its passes
    would find nothing to free, and a collection of a step's garbage timed inside the
    step-time check's reference work would not be the machine's speed."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
