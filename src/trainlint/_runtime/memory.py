"""What autograd keeps alive between steps, measured exactly and on any device.

Two counters, both maintained by finalizers rather than by scanning the heap (a
``gc.get_objects()`` walk costs tens of milliseconds in a process that has imported torch,
which would dwarf a small training step):

* saved bytes: every tensor an autograd graph saves for backward passes through our
  ``saved_tensors_hooks`` pack hook; the packed object dies when the graph frees it, after
  ``backward()`` or when the graph is dropped. Storages are counted once, however many
  graphs save them.
* graph nodes: the pack hook also tags the node that produced a saved tensor (its
  ``grad_fn``) by putting a sentinel in the node's ``metadata`` dict, which lives exactly as
  long as the C++ node. After ``backward()`` the saved buffers are gone, but a node is still
  alive while anything reaches it: ``total += loss`` chains every step's graph to the next,
  and only this counter sees that. Every realistic graph saves some non-leaf tensor (an
  activation, the input of the loss), so each graph gets at least one tagged node.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

_TAG = "trainlint.memory"


class _Packed:
    """Stands in for a saved tensor inside the graph; its death means the graph let go."""

    __slots__ = ("registry", "tensor")

    def __init__(
        self,
        tensor: torch.Tensor,
        registry: dict[int, tuple[Hashable, int]],
        key: Hashable,
        nbytes: int,
    ) -> None:
        self.tensor = tensor
        self.registry = registry
        registry[id(self)] = (key, nbytes)

    def __del__(self) -> None:
        self.registry.pop(id(self), None)


class _NodeTag:
    __slots__ = ("live",)

    def __init__(self, live: set[int]) -> None:
        self.live = live
        live.add(id(self))

    def __del__(self) -> None:
        self.live.discard(id(self))


class AutogradProbe:
    """Context manager counting saved-tensor bytes and graph nodes that are still alive."""

    def __init__(self) -> None:
        self.saved: dict[int, tuple[Hashable, int]] = {}
        self.nodes: set[int] = set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> AutogradProbe:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)

    def _pack(self, tensor: torch.Tensor) -> _Packed:
        node = tensor.grad_fn
        if node is not None:
            try:
                metadata: dict[str, Any] = node.metadata  # type: ignore[assignment]
                if _TAG not in metadata:
                    metadata[_TAG] = _NodeTag(self.nodes)
            except (AttributeError, RuntimeError):
                pass
        try:
            storage = tensor.untyped_storage()
            key: Hashable = (tensor.device, storage.data_ptr())
            nbytes = storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            key, nbytes = ("tensor", id(tensor)), tensor.nelement() * tensor.element_size()
        # Detached: holding the tensor itself would hold its grad_fn, and an output saved by
        # its own node (relu, sigmoid, exp save their result) would then form a reference
        # cycle through C++ that no garbage collection can break. Autograd restores the
        # history on unpack from its own metadata.
        return _Packed(tensor.detach(), self.saved, key, nbytes)

    def saved_bytes(self) -> int:
        storages: dict[Hashable, int] = {}
        for key, nbytes in list(self.saved.values()):
            storages[key] = nbytes
        return sum(storages.values())

    def live_nodes(self) -> int:
        return len(self.nodes)


def _unpack(packed: _Packed) -> torch.Tensor:
    return packed.tensor


def cuda_allocated() -> int | None:
    """Bytes the CUDA caching allocator has handed out, or None when CUDA is not in use.

    On a CPU build (or before CUDA is initialised) the memory functions return 0, which
    would read as "perfectly stable"; None keeps "not measured" distinct from "no growth".
    """
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return sum(_allocated(i) for i in range(torch.cuda.device_count()))


def _allocated(device: int) -> int:
    """``torch.cuda.memory_allocated(device)``, read from the allocator's nested counters:
    the public call flattens every counter (hundreds) into a new dict in Python, per device
    and step. No host-device sync either way: the allocator keeps them on the host."""
    try:
        return int(torch._C._cuda_memoryStats(device)["allocated_bytes"]["all"]["current"])
    except (AttributeError, KeyError, TypeError, RuntimeError):
        return int(torch.cuda.memory_allocated(device))
