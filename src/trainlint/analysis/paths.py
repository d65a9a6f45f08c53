"""Small helpers shared by rules that reason over step-loop paths."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel
from trainlint.analysis.steps import StepLoop


def precise_step_loops(model: FileModel) -> Iterator[StepLoop]:
    """Step loops whose paths were enumerated completely (rules stay silent otherwise)."""
    for sl in model.steps.step_loops:
        if sl.precise:
            yield sl


class Reported:
    """Deduplicates report anchors across paths and loops."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def first(self, node: ast.AST) -> bool:
        if id(node) in self._seen:
            return False
        self._seen.add(id(node))
        return True
