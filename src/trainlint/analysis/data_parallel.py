"""How a project splits its data across ranks, seen from the whole project: a file's part
of the project summary (does it reseed samplers with ``.set_epoch(...)``, build a
`DistributedSampler`, train under DDP/FSDP or `init_process_group`, hand loaders to a
framework that shards them, build a loader), and what the project view tells a file that
builds a sampler or a loader. A loader that leaves its file (returned by a helper, kept
on an object, handed to another module) is iterated where this file cannot see; what
the rest of the project never does, that place does not do either."""

from __future__ import annotations

import ast
import re

from trainlint.analysis.model import FileModel, is_false, keyword
from trainlint.analysis.torch_table import DATA_LOADER_SUBCLASSES

DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
DATA_LOADER = "torch.utils.data.DataLoader"
#: Calls that make a file's training data-parallel across ranks.
DISTRIBUTED_TRAINING = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.init_process_group",
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
)
# Framework calls that take a loader over and shard it (accelerate, Fabric, ignite, XLA).
HANDED_OVER = frozenset(
    {
        "prepare",
        "prepare_data_loader",
        "setup_dataloaders",
        "setup",
        "auto_dataloader",
        "MpDeviceLoader",
    }
)
#: A file without these bytes has nothing to say about how the data is split.
DATA_WORDS = (
    b"set_epoch",
    b"DistributedSampler",
    b"DataParallel",
    b"init_process_group",
    b"fully_shard",
    b"Loader(",
)


def data_facts(model: FileModel) -> dict[str, bool]:
    """The file's part of the project summary: ``sets`` when it calls ``.set_epoch(...)``
    on anything, ``samples`` when it builds a `DistributedSampler`, ``distributed`` when
    it trains under DDP/FSDP or starts a process group, ``hands`` when it calls a
    framework that takes loaders over, ``loads`` when it builds a `DataLoader` (only
    files that build a sampler or a loader are told what the rest of the project does).
    Empty when none."""
    out: dict[str, bool] = {}
    if model.calls.get("set_epoch"):
        out["sets"] = True
    if model.calls_to(DISTRIBUTED_SAMPLER):
        out["samples"] = True
    if model.calls_to(*DISTRIBUTED_TRAINING):
        out["distributed"] = True
    if any(model.calls.get(m) for m in HANDED_OVER):
        out["hands"] = True
    if model.calls_to(DATA_LOADER, *DATA_LOADER_SUBCLASSES):
        out["loads"] = True
    return out


def project_data(model: FileModel, fact: str) -> bool | None:
    """Does any file of the linted project have ``fact`` (a key of :func:`data_facts`:
    ``sets``, ``samples``, ``distributed``, ``hands``)? None when the file was linted
    without a project view (on its own), or its view does not say."""
    found = model.project_data
    if found is None:
        return None
    return fact in found


def project_sets_epoch(model: FileModel) -> bool | None:
    """Does any file of the linted project call ``.set_epoch(...)``? (See
    :func:`project_data`.)"""
    return project_data(model, "sets")


# Identifier parts that name a held-out split: its order does not change what it measures.
_HELD_OUT = re.compile(r"^(val|valid|validation|test|eval|evaluation|dev|holdout)$", re.IGNORECASE)


def reads_held_out(model: FileModel, sampler: ast.Call, loaders: list[ast.Call]) -> bool:
    """Does the sampler read a held-out split: its name, or its dataset's, says so
    (``val_sampler``, ``DistributedSampler(test_set)``), or every loader that holds it
    says ``shuffle=False`` (the author wants one fixed pass)? Its order then changes
    nothing that is measured."""
    if loaders and all(is_false(keyword(c, "shuffle")) for c in loaders):
        return True
    spelled: list[ast.AST] = [sampler.args[0]] if sampler.args else []
    spelled += [kw.value for kw in sampler.keywords if kw.arg == "dataset"]
    parent = model.parent_of(sampler)
    if isinstance(parent, ast.Assign):
        spelled += parent.targets
    for node in spelled:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name and any(_HELD_OUT.match(part) for part in name.split("_")):
            return True
    return False
