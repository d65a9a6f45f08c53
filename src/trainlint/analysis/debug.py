"""The step model of one file as stable text, for ``trainlint debug model FILE``.

It shows what every rule reads: the step loops and their epoch loops, the step events
of each path through an iteration in order (with the helper calls they came through
and the ``if`` guards they sit under), and the roles of names. Nothing in it depends on
object ids or dictionary order, so snapshot tests over fixtures turn a change to the
analysis into a reviewable diff.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from trainlint.analysis.effects import describe_call
from trainlint.analysis.model import dotted

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel
    from trainlint.analysis.roles import Binding, Key
    from trainlint.analysis.steps import Event, StepLoop

_LOOP_WORDS = {
    ast.For: "for",
    ast.AsyncFor: "async for",
    ast.While: "while",
    ast.FunctionDef: "def",
    ast.AsyncFunctionDef: "async def",
}


def describe(model: FileModel, path: str) -> str:
    """The file's step model, one fact a line."""
    out = [f"# step model of {path}"]
    out += _step_loops(model)
    out += _roles(model)
    out += _cross_file_calls(model)
    return "\n".join(out) + "\n"


def _where(model: FileModel, node: ast.AST) -> str:
    """``L12 for batch in loader`` / ``L30 def train_step`` / ``L8 while``."""
    line = getattr(node, "lineno", 0)
    word = _LOOP_WORDS.get(type(node), type(node).__name__)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"L{line} {word} {_qualified(model, node)}"
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return f"L{line} {word} {_short(node.target)} in {_short(node.iter)}"
    if isinstance(node, ast.While):
        return f"L{line} {word} {_short(node.test)}"
    return f"L{line} {word}"


def _qualified(model: FileModel, fn: ast.AST) -> str:
    name = getattr(fn, "name", "?")
    cls = model.class_of(fn)
    return f"{cls.name}.{name}" if cls is not None else name


def _short(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _step_loops(model: FileModel) -> list[str]:
    loops = model.steps.step_loops
    out = [f"step loops: {len(loops)}"]
    for loop in sorted(
        loops, key=lambda s: (getattr(s.node, "lineno", 0), getattr(s.node, "col_offset", 0))
    ):
        out += _step_loop(model, loop)
    return out


def _step_loop(model: FileModel, loop: StepLoop) -> list[str]:
    fn = model.function_of(loop.node)
    home = f" in {_qualified(model, fn)}" if fn is not None else ""
    out = [
        f"  loop {_where(model, loop.node)}{home}"
        + ("" if loop.precise else "  (paths cut: not precise)")
    ]
    for epoch in loop.epoch_loops:
        out.append(f"    epoch loop {_where(model, epoch)}")
    shown: list[str] = []
    for path in loop.paths:
        text = [_event(model, e) for e in path]
        block = "\n".join(text)
        if block in shown:
            continue  # paths that differ only in statements the model does not track
        shown.append(block)
    out.append(f"    paths: {len(shown)}")
    for i, block in enumerate(shown, 1):
        out.append(f"    path {i}:")
        out += [f"      {line}" for line in block.split("\n")] if block else ["      (no events)"]
    return out


def _event(model: FileModel, e: Event) -> str:
    parts = [f"L{getattr(e.node, 'lineno', 0)}", e.kind.value]
    if e.target:
        parts.append(f"`{e.target}`")
    if e.scaled:
        parts.append("scaled")
    if e.depth:
        parts.append(f"nested-loops={e.depth}")
    if e.via:
        parts.append(f"in {e.via}")
    if e.chain:
        parts.append(
            "via "
            + " > ".join(f"L{c.lineno} {dotted(c.func) or _short(c.func, 30)}()" for c in e.chain)
        )
    if e.guards:
        parts.append(
            "if "
            + " and ".join(
                f"{'' if taken else 'not '}({_short(g.test, 40)})" for g, taken in e.guards
            )
        )
    if e.rate_limited():
        parts.append("rate-limited")
    return " ".join(parts)


def _key_text(model: FileModel, key: Key) -> str:
    kind = key[0]
    if kind == "name":
        scope = next((f for f in model.functions if id(f) == key[1]), None)
        where = _qualified(model, scope) if scope is not None else "<module>"
        return f"{where}: {key[2]}"
    if kind == "attr":
        cls = next((c for c in model.classes if id(c) == key[1]), None)
        return f"{cls.name if cls is not None else '?'}: self.{key[2]}"
    return f"<dotted>: {key[1]}"


def _binding_text(b: Binding) -> str:
    line = getattr(b.node, "lineno", 0)
    made = f" = {b.qualname}(...)" if b.qualname else ""
    return f"L{line} {b.role.value}{made}"


def _roles(model: FileModel) -> list[str]:
    rows = []
    for key, bindings in model.roles.bindings.items():
        if not bindings:
            continue
        roles = {b.role for b in bindings}
        verdict = "" if len(roles) == 1 else "  (conflicting: no role)"
        text = ", ".join(sorted({_binding_text(b) for b in bindings}))
        rows.append(f"  {_key_text(model, key)} -> {text}{verdict}")
    return [f"roles: {len(rows)}", *sorted(rows)]


def _cross_file_calls(model: FileModel) -> list[str]:
    """Calls the step walker follows into other files of the project: the callee and
    the events each of its paths adds at the call, in the caller's names."""
    rows: list[tuple[tuple[int, int], list[str]]] = []
    for calls in model.calls.values():
        for call in calls:
            lines = describe_call(model, call)
            if lines is not None:
                rows.append(((call.lineno, call.col_offset), lines))
    out = [f"cross-file calls: {len(rows)}"]
    for _, lines in sorted(rows, key=lambda r: r[0]):
        out += [f"  {line}" for line in lines]
    return out
