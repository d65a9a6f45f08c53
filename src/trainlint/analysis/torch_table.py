"""What torch (and the frameworks around it) does to a module or optimizer it is handed:
which calls give back the same object or a wrapper sharing its parameters, which make a
new object, and which copy every parameter into a new tensor.

One table for every analysis and rule that asks "is this still the model the optimizer
holds?" (roles, escapes, TL107): a wrapper added here is known to all of them at once.
"""

from __future__ import annotations

# Methods of `nn.Module` (and tensors) that return the object they are called on:
# `model = model.to(device)` is the same model, its parameters moved in place.
SAME_OBJECT_METHODS = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "float",
        "double",
        "half",
        "bfloat16",
        "train",
        "eval",
        "requires_grad_",
        "share_memory",
        "apply",
        "type",
        "xpu",
        "mps",
    }
)

# Functions that wrap a module (or build a compiled view of it) sharing its parameters:
# an optimizer built from either one trains both.
SHARING_WRAPPERS = frozenset(
    {
        "torch.compile",
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.jit.script",
        "torch.distributed.fsdp.FullyShardedDataParallel",
        # Ray Train moves the module to the worker's device and wraps it in DDP
        "ray.train.torch.prepare_model",
        "ray.train.torch.train_loop_utils.prepare_model",
    }
)

# Families of wrappers known by their module, for questions where any of them will do
# ("could this call have made a new model?"): DDP, FSDP and its composable form, tracing.
_SHARING_PREFIXES = ("torch.nn.parallel.", "torch.distributed.")
_SHARING_MORE = frozenset(
    {"torch.jit.trace", "torch.jit.script", "torch.compile", "torch.nn.DataParallel"}
)

# Framework methods that hand back the objects they are given, prepared (accelerate's
# `prepare`, Fabric's `setup`, DeepSpeed's `initialize`): same parameters.
PREPARE_METHODS = frozenset({"prepare", "setup", "initialize", "setup_module", "setup_optimizers"})

# Further method spellings that keep a module's parameters when the result is bound to the
# model's name (`model = model.module`, `model = fsdp.wrap(model)`, `model.compile()`).
_KEEPING_SPELLINGS = frozenset({"module", "compile", "wrap"})

# Calls that build a new object (new parameter tensors) from an old one or from bytes.
NEW_OBJECT_FUNCS = frozenset(
    {
        "copy.deepcopy",
        "copy.copy",
        "pickle.load",
        "pickle.loads",
        "torch.load",
        "torch.jit.load",
        "dill.load",
        "joblib.load",
        "cloudpickle.loads",
    }
)

# In a child process that received shared tensors, these replace every parameter's data
# with a new tensor (another device or dtype): training then updates a private copy.
COPYING_METHODS = frozenset({"to", "cuda", "double", "half", "bfloat16", "xpu", "mps", "to_empty"})

# Loss scalers for mixed precision, however imported.
GRAD_SCALERS = frozenset(
    {
        "torch.cuda.amp.GradScaler",
        "torch.amp.GradScaler",
        "torch.GradScaler",
        "torch.cpu.amp.GradScaler",
    }
)

# `DataLoader` subclasses of other libraries that take its options (`shuffle`, `sampler`,
# `num_workers`) as keywords and hand them on: what holds for a `DataLoader` holds for
# them. Their positional parameters differ, so only keywords are read by name.
DATA_LOADER_SUBCLASSES = frozenset(
    {
        "torch_geometric.loader.DataLoader",
        "torch_geometric.loader.NeighborLoader",
        "torch_geometric.loader.LinkNeighborLoader",
        "torch_geometric.loader.HGTLoader",
        "torch_geometric.loader.ShaDowKHopSampler",
        "torch_geometric.loader.dataloader.DataLoader",
        "torch_geometric.loader.neighbor_loader.NeighborLoader",
        "torch_geometric.data.DataLoader",
        "torchdata.stateful_dataloader.StatefulDataLoader",
    }
)

# Framework calls that take over a data loader, and call `set_epoch` on its sampler
# themselves (accelerate's DataLoaderShard, Fabric, Lightning).
LOADER_PREPARE_METHODS = frozenset({"prepare", "prepare_data_loader", "setup_dataloaders", "setup"})


def keeps_parameters_method(name: str | None) -> bool:
    """A method whose result, bound back to the model's name, still holds the same
    parameters: the same object, a prepared one, or the wrapped module."""
    return name is not None and (
        name in SAME_OBJECT_METHODS or name in PREPARE_METHODS or name in _KEEPING_SPELLINGS
    )


def shares_parameters(qualname: str | None) -> bool:
    """A resolved function whose result shares its argument's parameters (DDP, FSDP,
    ``torch.compile``, ``torch.jit.script``/``trace``, anything in ``torch.distributed``)."""
    if qualname is None:
        return False
    return (
        qualname in SHARING_WRAPPERS
        or qualname in _SHARING_MORE
        or qualname.startswith(_SHARING_PREFIXES)
    )
