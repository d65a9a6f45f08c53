"""Where a NaN or Inf came from: a rerun of the failing step that watches it being made.

``assert_finite_grads`` finds the first non-finite gradient; this module says what made it.
The failing step is rerun with the same batch and random state, under anomaly detection
(for the forward tracebacks it records) and a dispatch mode that sees every operator the
forward runs. It tells apart:

- a forward pass that made the loss non-finite (an ``exp`` that overflowed, a ``log`` of
  0): the first forward op that turned finite inputs into NaN or Inf, and its line. The
  backward then only carries the loss's NaN into every gradient;
- a backward op that turned finite gradients into NaN or Inf (``SqrtBackward0`` at 0).

It also notes what the step used, so that a failure lists only the rules whose
preconditions hold: a ``GradScaler``, autocast, a softmax or log, other Python threads.
"""

from __future__ import annotations

import os
import re
import threading
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainlint._runtime.lintlink import display_path, outside_trainlint

#: Operators whose misuse TL602 describes (a softmax fed to a loss that applies its own,
#: the log of a softmax that underflowed to 0).
_LOG_OPS = ("softmax", "log_softmax", "log", "sigmoid", "nll_loss", "cross_entropy")


@dataclass
class Facts:
    """What the rerun of the failing step saw. ``forward``: (op, "NaN" | "Inf", site) of
    the first forward op to make a non-finite value from finite inputs; ``loss``: "NaN" or
    "Inf" when the tensor backward started from was already non-finite."""

    rerun: bool = False
    scaler: bool = False
    autocast: bool = False
    log_ops: bool = False
    threads: bool = False
    loss: str | None = None
    forward: tuple[str, str, str | None] | None = None
    inputs_nonfinite: bool = False
    ops: set[str] = field(default_factory=set)

    def holds(self, code: str) -> bool:
        """Whether what rule ``code`` needs was in the step (True when not known)."""
        if not self.rerun:
            return True
        need = {
            "TL601": self.scaler,
            "TL604": self.scaler,
            "TL603": self.autocast,
            "TL602": self.log_ops,
            "TL503": self.threads,
        }
        return need.get(code, True)


class _Located(BaseException):
    """Stops the rerun's backward once the op that made the non-finite value is known."""


def kind(torch: Any, tensors: Iterable[Any]) -> str | None:
    """ "NaN" or "Inf" when one of the floating tensors holds one, else None."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            if bool(torch.isnan(t).any()):
                return "NaN"
            if bool(torch.isinf(t).any()):
                return "Inf"
    return None


def locate_nonfinite(torch: Any, run: Any, rng: tuple[Any, Any]) -> tuple[str, Facts]:
    """Rerun the failing step (``run.again()``) from the random state ``rng``; the text
    that names what made the non-finite value, and what the step used.

    Anomaly detection itself reports NaN outputs only, and a step may switch it off
    (``set_detect_anomaly(False)``); so the rerun keeps it on whatever the step does and
    watches every backward node's outputs itself. The user's anomaly setting is restored.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    cpu_state, cuda_state = rng
    torch.set_rng_state(cpu_state)
    if cuda_state is not None:
        torch.cuda.set_rng_state_all(cuda_state)
    facts = Facts(rerun=True)
    found: list[tuple[str, str, Any]] = []  # (op, "NaN" | "Inf", node)
    error_text = None
    user_mode = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    set_anomaly = torch.set_anomaly_enabled
    backward = torch.autograd.backward
    scaler_class = torch.amp.GradScaler
    scale = scaler_class.scale
    in_backward = [False]

    def forced(mode: bool, check_nan: bool = True) -> None:
        set_anomaly(True, False)  # on, whatever the step asks; NaN checks are ours

    def noted_scale(self: Any, outputs: Any) -> Any:
        facts.scaler = facts.scaler or bool(self.is_enabled())
        return scale(self, outputs)

    def watch(roots: Any) -> None:
        seen: set[int] = set()
        stack = [getattr(r, "grad_fn", None) for r in roots]
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))

            def hook(grad_inputs: Any, grad_outputs: Any, node: Any = node) -> None:
                made = kind(torch, grad_inputs)
                if made is not None and kind(torch, grad_outputs) is None and not found:
                    found.append((node.name(), made, node))
                    raise _Located

            node.register_hook(hook)
            stack += [n for n, _ in node.next_functions]

    def watched_backward(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        if not in_backward[0]:
            in_backward[0] = True
            facts.loss = kind(torch, roots)
        watch(roots)
        return backward(tensors, *args, **kwargs)

    class Forward(TorchDispatchMode):  # type: ignore[misc]
        """Notes each forward op, and the first to make NaN or Inf from finite inputs."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            out = func(*args, **(kwargs or {}))
            if in_backward[0]:
                return out
            name = func.overloadpacket.__name__
            facts.ops.add(name)
            facts.autocast = facts.autocast or _autocast_on(torch)
            if facts.forward is None and not facts.inputs_nonfinite:
                made = kind(torch, tree_leaves(out))
                if made is not None:
                    if kind(torch, tree_leaves((args, kwargs))) is None:
                        facts.forward = (f"aten.{name}", made, _user_site())
                    else:  # it came in with the data or the weights
                        facts.inputs_nonfinite = True
            return out

    set_anomaly(True, False)
    torch.set_anomaly_enabled = forced
    torch.autograd.backward = watched_backward
    scaler_class.scale = noted_scale
    threads_before = set(threading.enumerate())
    try:
        with warnings.catch_warnings(), Forward():
            warnings.simplefilter("ignore")
            run.again()
    except _Located:
        pass
    except Exception as error:  # noqa: BLE001 - diagnostics must not replace the failure
        if not found:
            error_text = f"{type(error).__name__}: {error}"
    finally:
        scaler_class.scale = scale
        torch.autograd.backward = backward
        torch.set_anomaly_enabled = set_anomaly
        set_anomaly(*user_mode)
    facts.threads = _other_threads(threads_before)
    facts.log_ops = any("softmax" in op or op in _LOG_OPS for op in facts.ops)
    return _text(found, facts, error_text), facts


def _other_threads(before: set[threading.Thread]) -> bool:
    """Other Python threads may have run the model with the step: the step started one
    (alive after the rerun, not before), or a non-daemon thread other than this one was
    alive throughout. Daemon threads and idle executor workers left by earlier work (a
    test runner's, a timeout watcher's) do not count."""
    current = threading.current_thread()
    after = set(threading.enumerate())
    if after - before:
        return True
    return any(
        t is not current
        and t is not threading.main_thread()
        and not t.daemon
        and t.is_alive()
        and getattr(getattr(t, "_target", None), "__module__", "") != "concurrent.futures.thread"
        for t in before & after
    )


def _text(found: list[tuple[str, str, Any]], facts: Facts, error_text: str | None) -> str:
    parts = []
    if facts.loss is not None:
        parts.append(
            f"The forward pass made it: the loss was already {facts.loss} before backward(), "
            "and backward only carried it into the gradients."
        )
        if facts.forward is not None:
            op, what, site = facts.forward
            parts.append(
                f"The first forward op to turn finite inputs into {what}: {op}"
                + (f" at {site}" if site else "")
                + "."
            )
        elif facts.inputs_nonfinite:
            parts.append(
                "No forward op made it from finite inputs: the batch or the weights already "
                "held NaN or Inf."
            )
    if not found:
        if facts.loss is not None:
            return "\n".join(parts)
        why = f" (the rerun raised {error_text})" if error_text else ""
        return (
            "A rerun of that step did not name an op" + why + ": the non-finite value did "
            "not come out of a backward op (a gradient assigned or edited directly?)."
        )
    op, what, node = found[0]
    if facts.loss is not None:
        parts.append(f"(In backward, {op} turned finite gradients into {what} first.)")
        return "\n".join(parts)
    text = (
        f"Rerun of that step: {op} turned finite gradients into {what} "
        f"(the first backward op to do so)."
    )
    forward = forward_site(
        ["Traceback of forward call:\n" + "".join(node.metadata.get("traceback_", []))]
    )
    if forward:
        text += f"\nIt was created in the forward pass at {forward}"
    return text


def _autocast_on(torch: Any) -> bool:
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                return True
        except (TypeError, RuntimeError):  # an older torch: no device argument
            return bool(torch.is_autocast_enabled())
    return False


def _user_site() -> str | None:
    """The innermost frame of the user's code on the stack (not torch, not trainlint)."""
    for frame in reversed(traceback.extract_stack()):
        if outside_trainlint(frame.filename) and f"{os.sep}torch{os.sep}" not in frame.filename:
            code = (frame.line or "").strip()
            return f"{display_path(frame.filename)}:{frame.lineno} in {frame.name}: {code}"
    return None


def forward_site(messages: Iterable[str]) -> str | None:
    """The innermost frame outside torch in the forward traceback anomaly mode printed."""
    for message in messages:
        if "Traceback of forward call" not in message:
            continue
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)', message)
        user = [
            f for f in frames if f"{os.sep}torch{os.sep}" not in f[0] and outside_trainlint(f[0])
        ]
        if user:
            path, line, func, code = user[-1]
            return f"{display_path(path)}:{line} in {func}: {code.strip()}"
    return None
