"""TL0: meta rules. The engine itself reports these; the classes carry metadata and docs."""

from __future__ import annotations

from trainlint.rules.meta.syntax_error import SyntaxError_
from trainlint.rules.meta.unused_noqa import UnusedNoqa

__all__ = ["SyntaxError_", "UnusedNoqa"]
