"""Which softmax calls an expression's value certainly comes from (TL602, and the project
index's "this `forward` returns softmax"): the softmax case of :mod:`activations`."""

from __future__ import annotations

import ast

from trainlint.analysis.activations import SOFTMAX, layer_sources
from trainlint.analysis.model import FileModel


def softmax_sources(model: FileModel, expr: ast.AST) -> list[ast.AST]:
    """The softmax node(s) whose output ``expr`` certainly is; [] when not certain."""
    return layer_sources(model, expr, SOFTMAX)
