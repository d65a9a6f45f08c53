"""Small helpers shared by rules that reason over step-loop paths."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import LOOP_NODES, FileModel
from trainlint.analysis.steps import Event, StepLoop


def precise_step_loops(model: FileModel) -> Iterator[StepLoop]:
    """Step loops whose paths were enumerated completely (rules stay silent otherwise)."""
    for sl in model.steps.step_loops:
        if sl.precise:
            yield sl


def precise_loop_paths(model: FileModel) -> list[tuple[ast.AST, list[tuple[Event, ...]]]]:
    """Epoch loops, then step loops that are loop statements, each with its paths: only
    loops whose paths were enumerated completely."""
    steps = model.steps
    loops: list[tuple[ast.AST, list[tuple[Event, ...]]]] = []
    for ep in steps.epoch_loops:
        paths, precise = steps.loop_paths(ep)
        if precise:
            loops.append((ep, paths))
    for sl in steps.step_loops:
        if sl.precise and isinstance(sl.node, LOOP_NODES):
            loops.append((sl.node, sl.paths))
    return loops


class Reported:
    """Deduplicates report anchors across paths and loops."""

    def __init__(self) -> None:
        self._seen: set[int] = set()

    def first(self, node: ast.AST) -> bool:
        if id(node) in self._seen:
            return False
        self._seen.add(id(node))
        return True
