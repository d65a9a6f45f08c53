"""What every check shares: the failure type, and small helpers over parameters and losses.

No torch at import: the helpers that need it import it when called.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from trainlint._runtime.steps import StepRunner

Step = Callable[..., Any]


class CheckFailed(AssertionError):
    """A trainlint runtime check failed.

    ``check`` is the check's name, ``rules`` the codes of the static rules that explain the
    symptom and whose ``confirm_with`` is this check, ``result`` the measurements taken
    before the failure (a result object, or None).
    """

    # Shown as trainlint.testing.CheckFailed in tracebacks, where users import it from.
    __module__ = "trainlint.testing"

    def __init__(
        self, message: str, *, check: str, rules: tuple[str, ...] = (), result: Any = None
    ) -> None:
        super().__init__(message)
        self.check = check
        self.rules = rules
        self.result = result


def model_step_runner(
    check: str, model: Any, step: Step, steps: int, batches: Iterable[Any] | None
) -> StepRunner:
    """What a check of ``model`` does first: its arguments checked, and the runner of its
    step."""
    rt = _RUNTIME or _load_runtime()
    rt.check_model(check, model, step)
    rt.check_count("steps", steps, 1)
    return rt.StepRunner(step, batches, check=check)


class Runtime:
    """The runtime names the checks use (torch among them), bound on the first check: a
    ``from ... import`` of a loaded module per call cost ~0.7 us (CPython 3.11 looks up and
    fails to find the module's ``__path__`` each time), ~5k instructions, and a check made
    two to five of them."""

    __slots__ = (
        "torch",
        "check_count",
        "check_model",
        "StepRunner",
        "model_device",
        "match_params",
        "GradRecorder",
        "HookSet",
        "Snapshot",
        "register_optimizer_step_pre_hook",
    )

    def __init__(self) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        from trainlint._runtime.arguments import check_count, check_model
        from trainlint._runtime.recorder import GradRecorder, HookSet
        from trainlint._runtime.snapshot import Snapshot
        from trainlint._runtime.steps import StepRunner, match_params, model_device

        self.torch = torch
        self.check_count = check_count
        self.check_model = check_model
        self.StepRunner = StepRunner
        self.model_device = model_device
        self.match_params = match_params
        self.GradRecorder = GradRecorder
        self.HookSet = HookSet
        self.Snapshot = Snapshot
        self.register_optimizer_step_pre_hook = register_optimizer_step_pre_hook


def runtime() -> Runtime:
    """The runtime names, imported on the first call."""
    return _RUNTIME or _load_runtime()


def _load_runtime() -> Runtime:
    global _RUNTIME
    _RUNTIME = Runtime()
    return _RUNTIME


_RUNTIME: Runtime | None = None


def selects(specs: Any) -> bool:
    """Whether an ``ignore=``/``frozen=`` argument names anything: not None, and not an
    empty string or collection. A tensor, parameter or module always does: ``if specs:``
    raised for a tensor of several elements and skipped a one-element tensor holding 0."""
    if specs is None:
        return False
    return not isinstance(specs, (str, tuple, list, set, frozenset)) or len(specs) > 0


def trainable(
    model: torch.nn.Module,
    exclude: set[str] | None = None,
    walked: list[tuple[str, torch.Tensor]] | None = None,
) -> list[tuple[str, torch.Tensor]]:
    """The model's named parameters that require grad and hold elements, minus ``exclude``;
    ``walked``: its :func:`named_parameters`, when a check walked them already."""
    named = named_parameters(model, trainable=True) if walked is None else _kept(walked, True)
    if exclude:
        named = [(n, p) for n, p in named if n not in exclude]
    if not named:
        raise ValueError("the model has no trainable parameters to check")
    return named


def named_parameters(
    model: torch.nn.Module, *, trainable: bool = False
) -> list[tuple[str, torch.Tensor]]:
    """``list(model.named_parameters())``: the same names in the same order, each parameter
    and submodule once, read from the modules' ``_parameters`` and ``_modules`` by one loop
    over a stack (a depth-first walk in the public order) where no module overrides the
    walk; the public call's generators (named_modules, _named_members) cost 1.4x a
    recursive walk in a check on a small model, and that 1.3x this loop. ``trainable``:
    only those that require grad and hold elements."""
    base = _module_class()
    kind = type(model)
    if kind.named_parameters is not base.named_parameters or (
        kind._named_members is not base._named_members
    ):
        return _kept(list(model.named_parameters()), trainable)
    own_walk = base.named_modules
    out: list[tuple[str, torch.Tensor]] = []
    params: set[int] = set()
    modules: set[int] = set()
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        if id(module) in modules:
            continue
        if type(module).named_modules is not own_walk:
            return _kept(list(model.named_parameters()), trainable)
        modules.add(id(module))
        for name, param in module._parameters.items():
            if param is not None and id(param) not in params:
                params.add(id(param))
                if not trainable or (param.requires_grad and param.numel() > 0):
                    out.append((prefix + name, param))
        children = module._modules
        if children:  # pushed last to first: popped in order
            stack += [
                (prefix + name + ".", child)
                for name, child in reversed(children.items())
                if child is not None
            ]
    return out


def first_device(model: torch.nn.Module, walked: list[tuple[str, torch.Tensor]]) -> torch.device:
    """``model_device(model)`` (its first parameter's device) from its
    :func:`named_parameters` ``walked``, where ``model.parameters()`` is the base class's:
    the public generators cost ~25k instructions for a small model's first parameter."""
    if walked and type(model).parameters is _module_class().parameters:
        return walked[0][1].device
    return runtime().model_device(model)


def _module_class() -> type[torch.nn.Module]:
    """``torch.nn.Module``, imported on the first call: a ``from torch.nn import`` per call
    runs importlib's fromlist handling (torch.nn is a package) in every check."""
    global _MODULE
    if _MODULE is None:
        from torch.nn import Module

        _MODULE = Module
    return _MODULE


_MODULE: type[torch.nn.Module] | None = None


def _kept(named: list[tuple[str, torch.Tensor]], trainable: bool) -> list[tuple[str, torch.Tensor]]:
    if not trainable:
        return named
    return [(n, p) for n, p in named if p.requires_grad and p.numel() > 0]


def steps_text(which: list[int], total: int) -> str:
    if len(which) == total:
        return "all" if total > 1 else "0"
    return ", ".join(str(i) for i in which[:10]) + (", ..." if len(which) > 10 else "")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def loss_value(out: Any) -> float | None:
    """A float from what a step returned: a tensor, a number, or (loss, ...) / {"loss": ..}."""
    torch = runtime().torch

    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    elif isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    if isinstance(out, torch.Tensor):
        n = out.numel()
        if n == 0:
            return None
        if n == 1:
            # item(): no detached copy, and no warning (float() of a tensor that requires
            # grad warns); a complex loss raises what float() of the tensor raises
            with contextlib.suppress(TypeError):
                return float(out.item())
        detached = out.detach()
        return float(detached if n == 1 else detached.float().mean())
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return float(out)
    return None
