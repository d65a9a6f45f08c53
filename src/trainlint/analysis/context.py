"""Where code sits: test files, debug branches. Rules stay quieter there."""

from __future__ import annotations

import ast
import re
from pathlib import PurePath

from trainlint.analysis.model import FileModel

_DEBUG_WORD = re.compile(r"debug|anomal|detect_nan|sanity", re.IGNORECASE)


def is_test_file(path: str) -> bool:
    p = PurePath(path)
    name = p.name
    if name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py"):
        return True
    return any(part in ("tests", "test", "testing") for part in p.parts[:-1])


def in_debug_context(model: FileModel, node: ast.AST) -> bool:
    """Inside a test function, a debug-named function, or either branch of a debug `if`."""
    for anc in model.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            anc.name.startswith("test") or _DEBUG_WORD.search(anc.name)
        ):
            return True
        if isinstance(anc, (ast.If, ast.IfExp)):
            for sub in ast.walk(anc.test):
                text = (
                    sub.id
                    if isinstance(sub, ast.Name)
                    else sub.attr
                    if isinstance(sub, ast.Attribute)
                    else sub.value
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                    else ""
                )
                if text == "__debug__" or _DEBUG_WORD.search(text):
                    return True
    return False


def demonstrates_error(model: FileModel, node: ast.AST) -> bool:
    """``node`` is in the body of a ``try`` that catches ``RuntimeError`` (the error torch
    raises for misuse of autograd), outside any loop: a tutorial showing that the call
    fails, not a training step that runs it."""
    child = node
    for anc in model.ancestors(node):
        if isinstance(anc, (ast.For, ast.AsyncFor, ast.While)):
            return False
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False  # a function may be called from a loop elsewhere
        if isinstance(anc, ast.Try) and child in anc.body:
            for handler in anc.handlers:
                caught = handler.type
                names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
                if any(isinstance(n, ast.Name) and n.id == "RuntimeError" for n in names):
                    return True
        child = anc
    return False
