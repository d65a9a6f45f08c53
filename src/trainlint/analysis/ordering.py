"""What runs before what in one iteration of a step loop, over all its paths."""

from __future__ import annotations

from collections.abc import Sequence

from trainlint.analysis.steps import Event, Kind


def runs_before(paths: Sequence[Sequence[Event]], event: Event, kind: Kind) -> bool:
    """``event`` runs before the iteration's ``kind`` event: on no path through it does a
    ``kind`` event come first, and on at least one a ``kind`` event follows it."""
    later = False
    for path in paths:
        i = next((k for k, e in enumerate(path) if e is event), None)
        if i is None:
            continue
        if any(e.kind is kind for e in path[:i]):
            return False
        if not later and any(e.kind is kind for e in path[i + 1 :]):
            later = True
    return later
