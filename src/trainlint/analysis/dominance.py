"""Does one statement run before another on every way to it?"""

from __future__ import annotations

import ast

from trainlint.analysis.model import FileModel


def dominates(model: FileModel, stmt: ast.AST, use: ast.AST) -> bool:
    """Does ``stmt`` run before ``use`` on every way to it (same block, or a block enclosing
    it)? A definition in one branch of an ``if`` does not dominate a use after the ``if``."""
    if not isinstance(stmt, ast.stmt):
        stmt = model.statement_of(stmt)
    parent = model.parent_of(stmt)
    if parent is None:
        return False
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if not isinstance(block, list):
            continue
        for i, s in enumerate(block):
            if s is stmt:
                later = {id(x) for x in block[i + 1 :]}
                if id(use) in later:
                    return True
                for anc in model.ancestors(use):
                    if id(anc) in later:
                        return True
                    if anc is parent:
                        break
                return False
    return False
