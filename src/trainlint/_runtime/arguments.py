"""Checking what the user passed to a check, so that misuse fails with one clear line.

Without this, a step that needs a batch but got no ``batches=``, or a model and step passed
the wrong way round, surface as a ``TypeError`` or ``AttributeError`` from deep inside the
check or the user's own code, which reads like a bug in either.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch


def check_count(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_model(check: str, model: Any, step: Any) -> None:
    """``model`` must be a module; say so, and whether it was swapped with ``step``."""
    if isinstance(model, torch.nn.Module):
        return
    if isinstance(step, torch.nn.Module) and callable(model):
        raise TypeError(
            f"{check}(model, step, ...): model and step are swapped: model is "
            f"{_describe(model)} and step is a {type(step).__name__} module"
        )
    raise TypeError(f"{check}: model must be a torch.nn.Module, got {_describe(model)}")


def check_step(check: str, step: Any, *, batches: bool, name: str = "step") -> None:
    """``step`` must be a callable taking a batch exactly when ``batches`` is true."""
    if not callable(step):
        raise TypeError(f"{name} must be callable, got {_describe(step)}")
    if isinstance(step, torch.nn.Module):
        raise TypeError(
            f"{check}: {name} is a {type(step).__name__} module (its forward), not a "
            "training step: pass a function that performs one training step"
        )
    arity = _positional_arity(step)
    if arity is None:
        return  # a builtin or an extension: let the call say what it needs
    required, maximum = arity
    if not batches and required > 0:
        raise TypeError(
            f"{check}: {name}{_signature(step)} takes a batch but no batches= were given: pass "
            f"batches=[...], or make {name} take no arguments and close over its batch"
        )
    if batches and maximum == 0:
        raise TypeError(
            f"{check}: batches= were given but {name}{_signature(step)} takes no arguments: make it "
            f"{name}(batch), or drop batches="
        )
    if batches and required > 1:
        raise TypeError(
            f"{check}: {name}{_signature(step)} needs {required} arguments, but it is called with one "
            "batch: make it take one argument (a tuple unpacks inside)"
        )


def _positional_arity(func: Callable[..., Any]) -> tuple[int, int | None] | None:
    """(required, maximum) positional arguments of ``func``; maximum None means ``*args``."""
    if isinstance(func, types.FunctionType):
        # The common case, read off the code object: inspect.signature costs ~15 us, which
        # is a few percent of a tiny step checked once.
        code = func.__code__
        count = code.co_argcount
        required = count - len(func.__defaults__ or ())
        return required, None if code.co_flags & inspect.CO_VARARGS else count
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    required = 0
    maximum: int | None = 0
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            if maximum is not None:
                maximum += 1
            if param.default is param.empty:
                required += 1
        elif param.kind is param.VAR_POSITIONAL:
            maximum = None
    return required, maximum


def _signature(func: Callable[..., Any]) -> str:
    """``(b)``, ``(x, y=...)``, ``(*args)``: the parameters, without annotations."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return "(...)"
    shown = []
    for p in params:
        prefix = "*" if p.kind is p.VAR_POSITIONAL else "**" if p.kind is p.VAR_KEYWORD else ""
        shown.append(prefix + p.name + ("=..." if p.default is not p.empty else ""))
    return "(" + ", ".join(shown) + ")"


def _describe(value: Any) -> str:
    if inspect.isfunction(value) or inspect.ismethod(value):
        return f"the function {getattr(value, '__qualname__', 'step')}"
    if callable(value) and not isinstance(value, type):
        return f"a callable {type(value).__name__}"
    return f"a {type(value).__name__}"
