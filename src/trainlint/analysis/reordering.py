"""Can sibling statements trade places without changing what the code does? Control
flow a move could change (a return, a break out, a ``try``), and names one side writes
that the other reads or writes. Fixes that move statements ask this before moving."""

from __future__ import annotations

import ast

from trainlint.analysis.model import LOOP_NODES, dotted

_JUMPS = (
    ast.Return,
    ast.Break,
    ast.Continue,
    ast.Raise,
    ast.Try,
    ast.Yield,
    ast.YieldFrom,
    ast.Global,
    ast.Nonlocal,
) + ((ast.TryStar,) if hasattr(ast, "TryStar") else ())
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def jumps(stmt: ast.stmt) -> bool:
    """Control flow that moving the statement (or moving past it) could change: a
    return/raise, a break/continue out of it, a ``try``, a yield (nested defs do not
    count; a break inside a loop of its own does)."""
    todo: list[tuple[ast.AST, bool]] = [(stmt, False)]
    while todo:
        node, in_loop = todo.pop()
        if isinstance(node, (ast.Break, ast.Continue)):
            if not in_loop:
                return True
        elif isinstance(node, _JUMPS):
            return True
        inner = in_loop or isinstance(node, LOOP_NODES)
        todo.extend((c, inner) for c in ast.iter_child_nodes(node) if not isinstance(c, _OWN_SCOPE))
    return False


def _names(stmts: list[ast.stmt]) -> tuple[set[str], set[str]]:
    """The dotted names ``stmts`` read and the ones they write (``self.norm``, ``loss``;
    a subscript or attribute store writes into its base; nested scopes do not count)."""
    reads: set[str] = set()
    writes: set[str] = set()

    def target(node: ast.AST) -> None:
        if isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                target(elt)
        elif isinstance(node, (ast.Starred, ast.Subscript)):
            target(node.value)
        else:
            name = dotted(node)
            if name is not None:
                writes.add(name)

    todo: list[ast.AST] = list(stmts)
    while todo:
        node = todo.pop()
        if isinstance(node, _OWN_SCOPE) and node not in stmts:
            continue
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = dotted(node)
            if name is not None:
                if isinstance(node.ctx, ast.Load):
                    reads.add(name)  # the whole chain; its prefixes are not reads of their own
                else:
                    target(node)
                continue
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)):
            target(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            writes.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.AugAssign):
            target(node.target)
        todo.extend(ast.iter_child_nodes(node))
    return reads, writes


def _overlap(a: set[str], b: set[str]) -> bool:
    return any(x == y or x.startswith(y + ".") or y.startswith(x + ".") for x in a for y in b)


def independent(moved: list[ast.stmt], passed: list[ast.stmt]) -> bool:
    """Moving ``moved`` across ``passed`` keeps every name's value as each side saw it:
    neither writes what the other reads or writes."""
    m_reads, m_writes = _names(moved)
    p_reads, p_writes = _names(passed)
    return not (
        _overlap(m_reads, p_writes) or _overlap(m_writes, p_reads) or _overlap(m_writes, p_writes)
    )
