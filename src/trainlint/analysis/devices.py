"""Copies to an accelerator: ``x.to(device)``, ``x.to("cuda", non_blocking=True)``,
``x.cuda()``, told apart from dtype casts and ``.to(other_tensor)``."""

from __future__ import annotations

import ast
import re

from trainlint.analysis.model import FileModel, keyword

_DEVICE_WORDS = re.compile(r"device|cuda|gpu|rank", re.IGNORECASE)


def names_device(model: FileModel, node: ast.AST) -> bool:
    """An argument of `.to(...)` that names a device (not a dtype, not another tensor)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(":")[0] in ("cuda", "xpu", "mps", "npu")
    if isinstance(node, ast.Call):
        return model.qualname(node.func) == "torch.device"
    if isinstance(node, ast.Attribute):
        return (
            node.attr == "device"
            or bool(_DEVICE_WORDS.search(node.attr))
            and (model.qualname(node) is None)
        )
    if isinstance(node, ast.Name):
        return bool(_DEVICE_WORDS.search(node.id)) and model.qualname(node) is None
    return False


def device_copy(model: FileModel, call: ast.Call) -> ast.expr | None:
    """What ``call`` copies to a device (``x`` in ``x.to(device)``/``x.cuda()``), or None.
    A module (``torch.cuda``) is not a value being copied."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    if isinstance(func.value, (ast.Name, ast.Attribute)) and model.qualname(func.value):
        return None
    if func.attr == "cuda":
        return func.value
    if func.attr != "to":
        return None
    target = call.args[0] if call.args else keyword(call, "device")
    if target is None or not names_device(model, target):
        return None
    return func.value


#: Any sign that tensors of this file may live on an accelerator: a device named or
#: moved to, a launcher or framework that places the model for the user.
_ACCELERATOR_SIGNS = re.compile(
    r"cuda|device|\.to\(|gpu|\b(?:mps|xpu|npu|xla|tpu|xm)\b|accelerat|fabric|lightning|"
    r"deepspeed|DataParallel|distributed|local_rank|transformers|\bray\b",
    re.IGNORECASE,
)


def device_in_sight(model: FileModel) -> bool:
    """Might this file's tensors be on an accelerator at all? False for a script (or a
    notebook, all cells together) that never names a device, never moves anything and
    uses no framework that would: on the CPU, a host read waits for nothing."""
    return model.memo(device_in_sight, lambda m: bool(_ACCELERATOR_SIGNS.search(m.source.text)))
