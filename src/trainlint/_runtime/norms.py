"""Gradient norms kept as 0-d tensors while the steps run, and read on the host together
after them: on a GPU a read inside a step is a sync."""

from __future__ import annotations

from typing import Any

import torch


def norm(tensor: torch.Tensor) -> torch.Tensor:
    """The 2-norm as a 0-d tensor (one op, no host sync); fp16/bf16 square in float32."""
    if tensor.is_sparse:
        tensor = tensor.coalesce().values()
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.vector_norm(tensor, dtype=torch.float32)
    return torch.linalg.vector_norm(tensor)


def stacked_norm(norms: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of the norms, as a 0-d tensor on the first one's device."""
    if not all(n.is_cpu for n in norms) and len({n.device for n in norms}) > 1:
        norms = [n.to(norms[0].device) for n in norms]
    return torch.linalg.vector_norm(torch.stack(norms))


def total_norm(grads: list[torch.Tensor]) -> Any:
    """The 2-norm of all of ``grads`` together: one foreach reduction, a 0-d tensor (0.0
    for no gradient)."""
    if not grads:
        return 0.0
    detached = [g.detach() if g.requires_grad else g for g in grads]  # create_graph=True
    norms: list[Any] | None = None
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if all(g.layout is torch.strided and g.dtype in floats for g in detached):
        try:  # float32 accumulation; torch < 2.3 has no dtype= here
            norms = list(torch._foreach_norm(detached, 2, dtype=torch.float32))
        except (RuntimeError, TypeError):
            norms = None
    if norms is None:
        norms = [norm(g) for g in detached]
    return stacked_norm(norms)


def read_floats(values: list[Any]) -> list[float]:
    """Floats from numbers and one-element tensors, in order: the tensors in one host read
    per device and dtype."""
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            groups.setdefault((v.device, v.dtype), []).append(i)
    out = [0.0 if isinstance(v, torch.Tensor) else float(v) for v in values]
    for indices in groups.values():
        read = torch.stack([values[i].reshape(()) for i in indices]).tolist()
        for i, number in zip(indices, read, strict=True):
            out[i] = float(number)
    return out
