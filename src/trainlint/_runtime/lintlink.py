"""Run the static linter over the source lines of a failing step.

A runtime failure says *what* went wrong; the linter can often say *where*. We lint the
files that define the step (and the project functions it calls directly, which is where the
training logic usually lives when the step is a lambda in a test; also through a module
a fixture handed the test, and the project classes the step builds or runs), plus every project
function the step actually ran the first time a check called it (a call profiler around
that one call: `mod.train(...)` through a module, methods reached through objects), and keep
the findings that fall on those functions' lines. Any problem here (no source, a linter mid-refactor, a syntax
error) must never hide the runtime failure, so everything is best-effort.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import sysconfig
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

_MAX_SPANS = 24
_TRAINLINT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_MAX_FINDINGS = 20
_MAX_RAN = 64
# Modules searched for the names a function uses (a module a fixture handed it, its
# submodules): bounded so a package-wide `import *` cannot make a failure slow.
_MAX_MODULES = 8

# Project functions the current check's step ran (set by `record_ran`, one check at a time).
_ran: list[tuple[str, int, int]] = []
_project: dict[str, bool] = {}
# What each step function ran the first time a check called it (weak: a test's step dies
# with the test).
_ran_by_step: weakref.WeakKeyDictionary[Any, list[tuple[str, int, int]]] = (
    weakref.WeakKeyDictionary()
)


def reset_ran() -> None:
    """Forget what an earlier check's step ran (a new check starts)."""
    _ran.clear()


def record_ran(call: Callable[[], Any], key: Any = None) -> Any:
    """Call ``call()`` once while noting the project functions it enters.

    A call profiler (``sys.setprofile``) sees function entries only, but any profiler puts
    the interpreter in its slow tracing mode: ~0.15 ms on a 0.5 ms step. So what a step
    ran is recorded the first time a check calls it and kept for ``key`` (the step
    function), which later checks of the same step reuse. Nothing is recorded when another
    profiler is already installed.
    """
    known = _cached(key)
    if known is not None:
        _extend(known)
        return call()
    if sys.getprofile() is not None:
        return call()
    codes: dict[types.CodeType, None] = {}

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call":
            codes[frame.f_code] = None

    sys.setprofile(profile)
    try:
        return call()
    finally:
        sys.setprofile(None)
        spans = [span for span in map(_code_span, codes) if span is not None]
        _extend(spans)
        if key is not None:
            with contextlib.suppress(TypeError):  # not weakly referenceable, or unhashable
                _ran_by_step[key] = spans


def _cached(key: Any) -> list[tuple[str, int, int]] | None:
    if key is None:
        return None
    try:
        return _ran_by_step.get(key)
    except TypeError:
        return None


def _extend(spans: list[tuple[str, int, int]]) -> None:
    for span in spans:
        if span not in _ran and len(_ran) < _MAX_RAN:
            _ran.append(span)


def _code_span(code: types.CodeType) -> tuple[str, int, int] | None:
    path = code.co_filename
    known = _project.get(path)
    if known is None:
        known = _project[path] = os.path.isfile(path) and _is_project_file(path)
    if not known or code.co_name.startswith("<"):  # lambdas, comprehensions: their parent
        return None  # function's span covers them
    last = max(
        (line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno
    )
    return os.path.realpath(path), code.co_firstlineno, last


def findings_section(sources: Sequence[Callable[..., Any]], rules: Sequence[str] = ()) -> str:
    """The message block listing lint findings on the sources' lines, or ``""``.

    Findings of the ``rules`` the failure names come first, in that order (the rules that
    explain the symptom, most likely first), then the others by place: a long block of
    unrelated findings must not bury the one the failure is about."""
    try:
        spans = source_spans(sources)
        spans += [span for span in _ran if span not in spans]
        if not spans:
            return ""
        from trainlint import lint_paths

        paths = sorted({path for path, _, _ in spans})
        findings = lint_paths(paths, jobs=1)
        hits = []
        for f in findings:
            fpath = os.path.realpath(str(f.path))
            if any(fpath == path and start <= f.line <= end for path, start, end in spans):
                hits.append(f)
        rank = {code: i for i, code in enumerate(dict.fromkeys(rules))}
        hits.sort(key=lambda f: (rank.get(f.code, len(rank)), str(f.path), f.line, f.column))
        where = ", ".join(f"{display_path(p)}:{s}-{e}" for p, s, e in spans[:4])
        if len(spans) > 4:
            where += f", ... ({len(spans)} functions)"
        if not hits:
            return f"trainlint check found nothing on the step's lines ({where})."
        lines = [f"trainlint check findings on the step's lines ({where}):"]
        for f in hits[:_MAX_FINDINGS]:
            lines.append(
                f"  {display_path(str(f.path))}:{f.line}:{f.column}: {f.code} {f.name}: {f.message}"
            )
        if len(hits) > _MAX_FINDINGS:
            lines.append(f"  ... and {len(hits) - _MAX_FINDINGS} more")
        return "\n".join(lines)
    except Exception:  # noqa: BLE001 - a broken linter must not mask the runtime failure
        return ""


def source_spans(sources: Sequence[Callable[..., Any]]) -> list[tuple[str, int, int]]:
    """(real path, first line, last line) of each source and of project functions it calls."""
    spans: list[tuple[str, int, int]] = []
    seen: set[int] = set()
    queue: list[tuple[Any, int]] = [(s, 0) for s in sources]
    while queue and len(spans) < _MAX_SPANS:
        obj, depth = queue.pop(0)
        if isinstance(obj, type):
            # A model or scheduler class the check received or the step builds: its whole
            # body, where a project module defines it (a helper a fixture imported).
            if id(obj) not in seen:
                seen.add(id(obj))
                span = _span(obj)
                if span is not None and span not in spans:
                    spans.append(span)
            continue
        func = _function_of(obj)
        if func is None or id(func) in seen:
            continue
        seen.add(id(func))
        span = _span(func)
        if span is None:
            continue
        if span not in spans:
            spans.append(span)
        if depth < 2:
            queue += [(callee, depth + 1) for callee in _callees(func)]
    return spans


def _function_of(obj: Any) -> types.FunctionType | None:
    """The plain Python function behind a callable: partials, methods, callable objects."""
    for _ in range(8):
        if isinstance(obj, functools.partial):
            obj = obj.func
        elif isinstance(obj, types.MethodType):
            obj = obj.__func__
        elif isinstance(obj, types.FunctionType):
            return obj if inspect.unwrap(obj) is obj else _function_of(inspect.unwrap(obj))
        elif callable(obj) and not isinstance(obj, type):
            call = inspect.getattr_static(type(obj), "__call__", None)
            if not isinstance(call, types.FunctionType):
                return None
            obj = call
        else:
            return None
    return None


def _span(func: types.FunctionType | type) -> tuple[str, int, int] | None:
    try:
        path = inspect.getsourcefile(func)
        if path is None or not os.path.isfile(path) or not _is_project_file(path):
            return None
        lines, start = inspect.getsourcelines(func)
    except (OSError, TypeError):
        return None
    return os.path.realpath(path), max(start, 1), max(start, 1) + len(lines) - 1


def _callees(func: types.FunctionType) -> list[Any]:
    """Functions the code may call: globals and closure values named in its bytecode."""
    code = func.__code__
    names = set(code.co_names)
    for const in code.co_consts:  # nested lambdas/defs name their callees in their own code
        if isinstance(const, types.CodeType):
            names |= set(const.co_names)
    found: list[Any] = []
    objects: list[Any] = []
    for name in names:
        if name in func.__globals__:
            objects.append(func.__globals__[name])
    for cell in func.__closure__ or ():
        try:
            objects.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    # `helpers.make_scheduler(opt)` where `helpers` is a module a fixture returned (a
    # closure value) or conftest imported (a global): the function is an attribute of the
    # module, named in co_names. Submodules (`pkg.sched.make`) are followed the same way.
    modules = [obj for obj in objects if isinstance(obj, types.ModuleType)]
    seen_modules: set[int] = set()
    while modules and len(seen_modules) < _MAX_MODULES:
        module = modules.pop(0)
        if id(module) in seen_modules:
            continue
        seen_modules.add(id(module))
        for name in sorted(names):
            attr = getattr(module, name, None)
            if isinstance(attr, types.ModuleType):
                modules.append(attr)
            elif attr is not None:
                objects.append(attr)
    for obj in objects:
        if isinstance(obj, (types.FunctionType, functools.partial, types.MethodType)):
            found.append(obj)
        elif isinstance(obj, type):
            if _is_project_class(obj):
                found.append(obj)
        elif not isinstance(obj, types.ModuleType):
            # `trainer.train_step(batch)`: the method is named in co_names, the object is
            # a closure value or a global. `model(x)` runs the class's forward unnamed.
            cls = type(obj)
            for name in [*names, "forward"]:
                attr = getattr(cls, name, None)
                if isinstance(attr, types.FunctionType):
                    found.append(attr)
    return found


def _is_project_class(cls: type) -> bool:
    """Whether ``cls`` is defined in a project file (not torch's, not the stdlib's)."""
    module = sys.modules.get(getattr(cls, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and os.path.isfile(path) and _is_project_file(path)


def _is_project_file(path: str) -> bool:
    real = os.path.realpath(path)
    if "site-packages" in real or "dist-packages" in real:
        return False
    if real.startswith(_TRAINLINT_DIR + os.sep):
        return False
    for key in ("stdlib", "platstdlib"):
        root = sysconfig.get_paths().get(key)
        if root and real.startswith(os.path.realpath(root) + os.sep):
            return False
    return not real.startswith(os.path.realpath(sys.prefix) + os.sep + "lib")


def outside_trainlint(path: str) -> bool:
    """Whether ``path`` is not one of trainlint's own files (a frame of the user's, or of
    a library the user called)."""
    return not os.path.realpath(path).startswith(_TRAINLINT_DIR + os.sep)


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it lies beneath it or nearby."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith(".." + os.sep + "..") else rel
