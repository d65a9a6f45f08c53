"""What several concurrency rules share."""

from __future__ import annotations


def shown(names: set[str]) -> str:
    """ "`model` is" / "`model`, `opt` are", for messages."""
    listed = ", ".join(f"`{n}`" for n in sorted(names))
    return listed + (" are" if len(names) > 1 else " is")
