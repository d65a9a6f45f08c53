"""Step effects of functions, across files (issue 13, part 2).

A function's *effects* are the step events its body runs, in order, one list per path
(the step walker's paths through it, same-file helpers inlined), with each event's
receiver said in the function's own terms: a parameter (``["p", "optimizer", ""]``),
an attribute of ``self`` (``["s", "optimizer"]``), or something of its own that no
caller can name (``["o", "engine.train_step:opt"]``). A call to a function of another
file is kept as a placeholder (``["CALL", qualname, args, depth, flags]``): the
project index, which sees every file, replaces it by that function's effects (bounded
depth, cycles cut) when it gives a caller its view.

At lint time the walker asks :func:`foreign_paths` at each call it cannot resolve in
the file: a call the view names gets the callee's paths as synthetic events mapped onto
the call's arguments, each with ``node`` the call and ``via`` the callee (SPEC §7: a
helper's events are reported at its call in the loop).

Everything here is plain data (JSON) in the summary and the view: the view's digest
keys the caller's cache entry, so a callee whose effects change re-lints its callers.
"""

from __future__ import annotations

import ast
import bisect
import re
import sys
from typing import TYPE_CHECKING, Any

from trainlint.analysis.arguments import parameter_names, passed_for
from trainlint.analysis.assignments import single_assignments
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import dotted, walk_local
from trainlint.analysis.modes import resolve_through_calls
from trainlint.analysis.project_modules import absolute, project_candidate
from trainlint.analysis.step_events import is_logging_guard
from trainlint.analysis.step_paths import PathWalker
from trainlint.analysis.steps import (
    FLAG_COUNTER,
    FLAG_LOGGING,
    Event,
    Kind,
    Path,
    is_counter_guard,
)

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel, FunctionNode

#: distinct effect paths kept per function; more and the function is "imprecise"
MAX_EFFECT_PATHS = 16
FLAG_SCALED = 4
Effect = list[Any]
_KINDS = {k.name: k for k in Kind}


# -- summary side -----------------------------------------------------------------------------


def effects_of(
    model: FileModel, fn: FunctionNode, qualname: str, module: str, is_pkg: bool
) -> dict[str, Any] | None:
    """``{"paths": [[effect, ...], ...]}`` (``"imprecise": True`` when cut) for ``fn``;
    None when it has no step event and calls no other file's function."""
    if id(fn) not in _event_functions(model) and not (
        _WRAPPER_NAMES.search(fn.name) and (model.steps.may_train(fn) or _calls_out(model, fn))
    ):
        return None  # (a function whose events are in same-file helpers or other files is
        # followed when its name says it may run a step: `fit`, `run_epoch`, `evaluate`)
    steps = model.steps  # (not before: most functions stop above, without the roles)
    params = parameter_names(fn)
    method = model.class_of(fn) is not None and bool(params) and params[0] == "self"
    if method:
        params = params[1:]
    here = f"{module}.{qualname}" if module else qualname

    encoded: dict[tuple[str, tuple[int, ...]], list[Any] | None] = {}

    def encode(target: str | None, chain: tuple[ast.Call, ...]) -> list[Any] | None:
        if target is None:
            return None
        key = (target, tuple(id(c) for c in chain))
        if key not in encoded:
            encoded[key] = _encode(target, chain)
        return encoded[key]

    def _encode(target: str, chain: tuple[ast.Call, ...]) -> list[Any] | None:
        resolved = resolve_through_calls(model, target, chain)
        if resolved is None:
            return ["o", f"{here}:?"]
        root, _, rest = resolved.partition(".")
        if root in params:
            return ["p", root, rest]
        if method and root == "self":
            return ["s", rest]
        return ["o", f"{here}:{resolved}"]

    def placeholder(
        walker: PathWalker, call: ast.Call, depth: int, guards: tuple[tuple[ast.If, bool], ...]
    ) -> list[Path] | None:
        try:
            full = targets[id(call)]
        except KeyError:
            full = targets[id(call)] = _project_target(model, call, module, is_pkg)
        if full is None:
            return None
        return [(_Placeholder(Kind.CALL, call, full, walker.chain, guards, depth),)]

    # which project function a call runs: asked again for every walk that meets the call
    targets: dict[int, str | None] = model.memo(_project_target, lambda _: {})

    walker = PathWalker(steps, foreign=placeholder)
    paths = walker.run(fn.body)
    guard_flags: dict[int, int] = {}

    def effect_of(e: Event) -> Effect:
        flags = e.flags | (FLAG_SCALED if e.scaled else 0) | _guard_flags(e, guard_flags)
        if not isinstance(e, _Placeholder):
            return [e.kind.name, encode(e.target, e.chain), e.depth, flags]
        args: list[list[Any]] = []
        call = e.node
        assert isinstance(call, ast.Call)
        stop = next(
            (i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)), len(call.args)
        )
        given: list[tuple[int | str, ast.expr]] = [
            *enumerate(call.args[:stop]),
            *((k.arg, k.value) for k in call.keywords if k.arg),
        ]
        for where, arg in given:
            enc = encode(dotted(arg), e.chain) if dotted(arg) else None
            if enc is not None and enc[0] != "o":  # (the rest: nothing to map)
                args.append([where, enc])
        return ["CALL", e.target, args, e.depth, flags]

    # Paths share most of their events: each event is encoded once, with its repr, and a
    # path is told from the others by its events' reprs (as by the repr of the whole).
    encoded_events: dict[int, tuple[Effect, str]] = {}
    out: list[list[Effect]] = []
    seen: set[tuple[str, ...]] = set()
    for path in paths:
        entries = []
        for e in path:
            entry = encoded_events.get(id(e))
            if entry is None:
                effect = effect_of(e)
                entry = encoded_events[id(e)] = (effect, repr(effect))
            entries.append(entry)
        key = tuple(r for _, r in entries)
        if key not in seen:
            seen.add(key)
            out.append([effect for effect, _ in entries])
            if len(out) > MAX_EFFECT_PATHS:
                break
    if not any(out):
        return None
    if not walker.precise or len(out) > MAX_EFFECT_PATHS:
        # cut: its callers' paths are not precise either, when it has events of its own
        # (calls of other files only: followed no further, as an unresolved call)
        own = any(e[0] != "CALL" for p in out for e in p)
        return {"imprecise": True} if own else None
    return {"paths": out}


#: Top-level packages a project call never goes to (unless the project is that package)
_NOT_PROJECT = frozenset(sys.stdlib_module_names) | {
    "torch",
    "torchvision",
    "torchaudio",
    "numpy",
    "np",
    "scipy",
    "pandas",
    "sklearn",
    "pytest",
    "tqdm",
    "wandb",
    "PIL",
    "cv2",
    "einops",
    "transformers",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "timm",
    "ray",
    "matplotlib",
    "yaml",
    "h5py",
    "tensorboard",
    "tensorboardX",
    "omegaconf",
    "hydra",
    "deepspeed",
    "apex",
    "triton",
    "safetensors",
    "huggingface_hub",
    "datasets",
    "requests",
    "packaging",
    "psutil",
    "fairscale",
    "xformers",
    "mmcv",
    "mmengine",
    "jax",
    "tensorflow",
    "tf",
    "onnx",
}


def not_project(raw: str, full: str, own_top: str) -> bool:
    """Does an import (``raw`` as written, ``full`` made absolute) lead out of the
    project: the standard library or a well-known package that is not the file's own?"""
    top = full.split(".", 1)[0]
    return not raw.startswith(".") and top != own_top and top in _NOT_PROJECT


def _project_target(model: FileModel, call: ast.Call, module: str, is_pkg: bool) -> str | None:
    """The absolute name of the project function ``call`` runs, when it may run one."""
    qual = model.qualname(call.func)
    if qual is None or not project_candidate(qual) or qual.rsplit(".", 1)[-1][:1].isupper():
        return None  # (a class: its constructor is not followed)
    full = absolute(qual, module, is_pkg)
    if not_project(qual, full, module.split(".", 1)[0]):
        return None  # the standard library, a well-known third-party package
    return full


class _Placeholder(Event):
    """A call to another file's function, in a summary walk (never seen by rules)."""


def _guard_flags(e: Event, memo: dict[int, int]) -> int:
    flags = 0
    for g, _ in e.guards:
        found = memo.get(id(g))
        if found is None:
            found = memo[id(g)] = (
                FLAG_COUNTER
                if is_counter_guard(g.test)
                else (FLAG_LOGGING if is_logging_guard(g.test) else 0)
            )
        flags |= found
    return flags


_WRAPPER_NAMES = re.compile(
    r"train|step|epoch|eval|valid|test|fit|update|optimi|backward|"
    r"loop|run|iter|batch|clip|sched",
    re.IGNORECASE,
)


#: calls that can be step events (StepModel.classify); `update` is left out: a scaler's
#: update alone is no effect a caller can use, and `dict.update` is everywhere
_EFFECT_CALLS = (
    "backward",
    "manual_backward",
    "step",
    "optimizer_step",
    "zero_grad",
    "eval",
    "train",
    "unscale_",
    "clip_grad_norm_",
    "clip_grad_value_",
    "clip_grad_norm",
    "clip_gradients",
    "clip_grads_with_norm_",
    "get_total_norm",
    "zero_",
)


def _event_functions(model: FileModel) -> set[int]:
    """Ids of the functions (innermost) that make a call that may be a step event, or
    read ``.grad``: one pass over the file's call table, not a walk per function."""

    def build(m: FileModel) -> set[int]:
        out: set[int] = set()
        for name in _EFFECT_CALLS:
            for call in m.calls.get(name, ()):
                fn = m.function_of(call)
                while fn is not None and id(fn) not in out:
                    out.add(id(fn))  # (and the functions around it)
                    fn = m.function_of(fn)
        if ".grad" in m.source.text:  # functions spanning a line that spells `.grad`
            lines = [i for i, text in enumerate(m.source.lines, 1) if ".grad" in text]
            for fn in m.functions:
                end = getattr(fn, "end_lineno", None) or fn.lineno
                at = bisect.bisect_left(lines, fn.lineno)  # the first such line from its top
                if at < len(lines) and lines[at] <= end:
                    out.add(id(fn))
        return out

    return model.memo(_event_functions, build)


def _calls_out(model: FileModel, fn: FunctionNode) -> bool:
    """Does ``fn`` call something imported (a candidate function of another file)?"""
    for node in walk_local(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            qual = model.qualname(node.func)
            if qual is not None and project_candidate(qual) and model.resolve_call(node) is None:
                return True
    return False


# -- lint side ----------------------------------------------------------------------------------


def resolve_foreign(
    model: FileModel, call: ast.Call
) -> tuple[dict[str, Any], ast.expr | None] | None:
    """The view's entry for the project function ``call`` runs, and the receiver its
    ``self`` is (methods); None when the call is not one the view resolves."""
    view = model.project
    calls = view.get("calls") if view else None
    if not calls:
        return None
    func = call.func
    if not isinstance(func, (ast.Name, ast.Attribute)):
        return None
    qual = model.qualname(func)
    if qual is not None:
        entry = calls.get(qual)
        if entry is not None and not entry.get("method"):
            return entry, None
        return None
    # `helper.record(loss)` with `helper = Tracker(...)` assigned once in the scope, or
    # `self.helper.record(loss)` with `self.helper = Tracker(...)` once in the class
    if not isinstance(func, ast.Attribute):
        return None
    values: list[ast.expr] | None = None
    if isinstance(func.value, ast.Name) and func.value.id != "self":
        values = single_assignments(model).get((id(model.scope_of(func.value)), func.value.id))
    elif (
        isinstance(func.value, ast.Attribute)
        and isinstance(func.value.value, ast.Name)
        and (func.value.value.id == "self")
    ):
        cls_node = model.enclosing_class(call)
        if cls_node is not None:
            values = _self_assignments(model).get((id(cls_node), func.value.attr))
    if values is not None and len(values) == 1 and isinstance(values[0], ast.Call):
        cls = model.qualname(values[0].func)
        entry = calls.get(f"{cls}.{func.attr}") if cls is not None else None
        if entry is not None and entry.get("method"):
            return entry, func.value
    return None


def _self_assignments(model: FileModel) -> dict[tuple[int, str], list[ast.expr]]:
    """(class, attribute) -> the values ``self.attribute`` is assigned in its methods."""

    def build(m: FileModel) -> dict[tuple[int, str], list[ast.expr]]:
        out: dict[tuple[int, str], list[ast.expr]] = {}
        for node in m.assignments:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and (t.value.id == "self")
                ):
                    cls = m.enclosing_class(node)
                    if cls is None:
                        continue
                    value = node.value if isinstance(node, ast.Assign) else None
                    out.setdefault((id(cls), t.attr), []).append(value if value is not None else t)
        return out

    return model.memo(_self_assignments, build)


def foreign_paths(
    walker: PathWalker, call: ast.Call, depth: int, guards: tuple[tuple[ast.If, bool], ...]
) -> list[Path] | None:
    """Synthetic events of a call into another file's function (None: not one)."""
    found = resolve_foreign(walker.steps.model, call)
    if found is None:
        return None
    entry, receiver = found
    if entry.get("imprecise"):
        walker.precise = False
        return [()]
    via = entry["fn"]
    out: list[Path] = []
    for effects in entry["paths"]:
        path: list[Event] = []
        for kind, target, d, flags in effects:
            path.append(
                Event(
                    _KINDS[kind],
                    call,
                    map_target(entry, call, receiver, target),
                    walker.chain,
                    guards,
                    depth + d,
                    bool(flags & FLAG_SCALED),
                    via,
                    flags & (FLAG_COUNTER | FLAG_LOGGING),
                )
            )
        out.append(tuple(path))
    return out or [()]


def map_target(
    entry: dict[str, Any], call: ast.Call, receiver: ast.expr | None, target: list[Any] | None
) -> str | None:
    """An effect's receiver in the caller's terms: the argument the call passes for the
    parameter, the receiver's attribute; ``<module.function:name>`` for what the caller
    cannot name (never equal to one of its own names)."""
    if target is None:
        return None
    if target[0] == "o":
        return f"<{target[1]}>"
    if target[0] == "s":
        base = dotted(receiver) if receiver is not None else None
        if base is None:
            return f"<{entry['fn']}:self>"
        return f"{base}.{target[1]}" if target[1] else base
    name, rest = target[1], target[2]
    arg = argument(entry, call, name)
    base = dotted(arg) if arg is not None else None
    if base is None:
        return f"<{entry['fn']}:{name}>"
    return f"{base}.{rest}" if rest else base


def argument(entry: dict[str, Any], call: ast.Call, name: str) -> ast.expr | None:
    """The expression ``call`` passes for the parameter ``name`` of the view's function."""
    return passed_for(call, entry.get("params", []), name)


def describe_call(model: FileModel, call: ast.Call) -> list[str] | None:
    """``trainlint debug model``: the callee and its synthetic events, one path a line."""
    found = resolve_foreign(model, call)
    if found is None:
        return None
    entry, receiver = found
    if entry.get("imprecise"):
        return [f"L{call.lineno} {dotted(call.func)}() -> {entry['fn']} (paths cut: not precise)"]
    lines = [f"L{call.lineno} {dotted(call.func)}() -> {entry['fn']}"]
    for i, effects in enumerate(entry["paths"], 1):
        words = []
        for kind, target, d, flags in effects:
            text = _KINDS[kind].value
            mapped = map_target(entry, call, receiver, target)
            if mapped:
                text += f" `{mapped}`"
            if d:
                text += f" nested-loops={d}"
            if flags & (FLAG_COUNTER | FLAG_LOGGING):
                text += " rate-limited"
            words.append(text)
        lines.append(f"  path {i}: " + (", ".join(words) if words else "(no events)"))
    return lines


# The answers this module gives to lower layers (see analysis.hooks).
ANSWERS.resolve_foreign = resolve_foreign
ANSWERS.foreign_argument = argument
ANSWERS.foreign_paths = foreign_paths
