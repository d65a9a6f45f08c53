"""TL505 loader-without-distributed-sampler."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.call_keywords import expanded_keywords
from trainlint.analysis.data_parallel import DISTRIBUTED_TRAINING, project_data
from trainlint.analysis.loaders import (
    handed_over,
    is_plain_loader,
    leaves_unread,
    loader_constructions,
    mentions_rank,
    rank_dependent_data,
    reaching_keys,
    training_loops_over,
    true_by_default,
)
from trainlint.analysis.model import FileModel, is_true
from trainlint.rules.base import Invalid, Report, Rule


class LoaderWithoutDistributedSampler(Rule):
    """## What it does
    Flags a shuffling `DataLoader` (`shuffle=True`, no `sampler=`/`batch_sampler=`, also
    none in a `**opts` dict literal; other libraries' subclasses such as PyG's
    `NeighborLoader` too) that a training loop iterates (also through a progress bar, a same-file factory's return or
    a trainer object's attribute) in a file that trains with `DistributedDataParallel`/FSDP
    or calls `torch.distributed.init_process_group`, when nothing gives each rank its own
    part of the data: no `DistributedSampler` (or other sampler), no dataset (nor
    item-picking argument, like `input_nodes=`) built from the rank or world size (the device its tensors are copied to does not split them),
    and the loader is not handed to a framework that shards it
    (`accelerator.prepare`, Fabric's `setup_dataloaders`). A loader built in a branch that
    tests the distributed setup (`if args.distributed: ... else: ...`) is not reported.
    A loader that leaves its file (returned by a helper, wrapped in a generator, kept on
    an object) is also reported, in a file without DDP, when it shuffles at its function's
    defaults (`shuffle=not deterministic`, `deterministic=False`) and another file of the
    linted project trains under DDP while no file builds a `DistributedSampler`, calls
    `set_epoch` or hands loaders to such a framework.

    ## Why is this bad?
    Every rank runs the same script over the same dataset; with a plain shuffling loader
    each rank draws its own random order of the *whole* dataset. DDP averages gradients
    across ranks, so N ranks cost N times the compute but see no more data per epoch than
    one: an "epoch" is N epochs of samples, schedules measured in epochs run N times too
    long per unit of data, and scaling to more GPUs buys nothing. Nothing fails.

    ## Example
    ```python
    dist.init_process_group("nccl")
    model = DistributedDataParallel(Net().cuda(), device_ids=[local_rank])
    loader = DataLoader(train_set, batch_size=64, shuffle=True)
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...
    ```

    ## References
    - [torch.utils.data.distributed.DistributedSampler](https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler)
    - [Getting started with DDP](https://pytorch.org/tutorials/intermediate/ddp_tutorial.html)
    """

    code = "TL505"
    name = "loader-without-distributed-sampler"
    message = (
        "shuffling `DataLoader` in a distributed training loop without a distributed "
        "sampler: every rank trains on the whole dataset; pass "
        "`sampler=DistributedSampler(dataset)`"
    )
    triggers = ("Loader",)
    confirm_with = "assert_ddp_in_sync"
    valid = [
        # the distributed sampler shards the data
        """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

dist.init_process_group("nccl")
model = DDP(Net().cuda())
sampler = DistributedSampler(train_set)
loader = DataLoader(train_set, batch_size=64, sampler=sampler)
for epoch in range(10):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
""",
        # single-process branch of a script that supports both
        """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

if args.distributed:
    dist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(model)
    loader = DataLoader(ds, sampler=DistributedSampler(ds))
else:
    loader = DataLoader(ds, shuffle=True)
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # the dataset itself is split by rank
        """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
part = Subset(ds, range(rank, len(ds), world))
loader = DataLoader(part, batch_size=8, shuffle=True)
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # accelerate shards the loader it prepares
        """
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

loader = DataLoader(ds, shuffle=True, batch_size=16)
model, opt, loader = accelerator.prepare(model, opt, loader)
for x in loader:
    opt.zero_grad()
    accelerator.backward(model(x).sum())
    opt.step()
""",
        # an evaluation loader: no training loop iterates it
        """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
val_loader = DataLoader(val_ds, batch_size=64, shuffle=True)
with torch.no_grad():
    for x in val_loader:
        metric.update(model(x))
""",
        # not distributed at all
        """
import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=64, shuffle=True)
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # shadowed: a local `DataLoader` that is not torch's
        """
import torch
import torch.distributed as dist

def DataLoader(ds, **kw):
    return ds.shard(dist.get_rank())

dist.init_process_group("nccl")
loader = DataLoader(ds, shuffle=True)
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # no torch: a project's own DataLoader
        """
class DataLoader:
    def __init__(self, items, shuffle=False):
        self.items = items

loader = DataLoader(items, shuffle=True)
for item in loader.items:
    item.backward()
    optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

dist.init_process_group("nccl")
model = DistributedDataParallel(Net().cuda())
loader = DataLoader(train_set, batch_size=64, shuffle=True)
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
""",
            line=8,
            column=10,
        ),
        # aliased import; the loader is iterated in a helper; the process group is set
        # up by the spawned worker
        Invalid(
            """
import torch
import torch.multiprocessing as mp
from torch import distributed as tdist
from torch.utils import data as tud

def train_epoch(model, batches, opt):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

def worker(rank, world_size):
    tdist.init_process_group("gloo", rank=rank, world_size=world_size)
    model = torch.nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_loader = tud.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)
    for epoch in range(5):
        train_epoch(model, train_loader, opt)

mp.spawn(worker, args=(2,), nprocs=2)
""",
            line=16,
        ),
        # iterated through a progress bar bound to a name first
        Invalid(
            """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from tqdm import tqdm

dist.init_process_group("nccl")
model = torch.nn.parallel.DistributedDataParallel(Net().cuda())
loader = DataLoader(train_set, batch_size=64, shuffle=True)
for epoch in range(10):
    bar = tqdm(loader)
    for x, y in bar:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
""",
            line=8,
        ),
        # the rank only picks the device the (same) tensors are copied to
        Invalid(
            """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("nccl")
rank = dist.get_rank()
xs = torch.load("xs.pt").cuda(rank)
model = torch.nn.parallel.DistributedDataParallel(Net().cuda(rank))
loader = DataLoader(TensorDataset(xs), batch_size=64, shuffle=True)
for (x,) in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
            line=9,
        ),
        # returned by a factory, stored on a trainer object, iterated as `self.loader`
        Invalid(
            """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

class Fit:
    def __init__(self, loader):
        self.loader = loader
    def epoch(self):
        for x in self.loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

def loaders():
    return DataLoader(ds, shuffle=True), None

dist.init_process_group("nccl")
model = torch.nn.parallel.DistributedDataParallel(Net())
train, _ = loaders()
Fit(train).epoch()
""",
            line=15,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        here = bool(model.calls_to(*DISTRIBUTED_TRAINING))
        # or another file trains under DDP and nothing in the project splits any data
        elsewhere = not here and self._project_unsplit(model)
        if not here and not elsewhere:
            return
        for call in loader_constructions(model):
            # keywords, also those a `**opts` dict literal brings; None: cannot tell
            kwargs = expanded_keywords(model, call)
            if kwargs is None or "sampler" in kwargs or "batch_sampler" in kwargs:
                continue
            plain = is_plain_loader(model, call)
            if plain and len(call.args) > 3:
                continue  # a sampler may come positionally
            shuffle = kwargs.get("shuffle") or (
                call.args[2] if plain and len(call.args) > 2 else None
            )
            if not (is_true(shuffle) or elsewhere and true_by_default(model, shuffle)):
                continue  # unshuffled: may be an IterableDataset that shards itself
            if rank_dependent_data(model, call, kwargs) or self._in_distributed_branch(model, call):
                continue
            keys = reaching_keys(model, call)
            if handed_over(model, [call], keys):
                continue
            if (
                training_loops_over(model, [call], keys)
                if here
                else leaves_unread(model, call, keys)
            ):
                yield self.report(call)

    @staticmethod
    def _project_unsplit(model: FileModel) -> bool:
        """Does another file of the project train under DDP/FSDP while no file builds a
        `DistributedSampler`, reseeds one, or hands loaders to a framework that shards
        them? Then a loader this file gives away reaches that training unsplit."""
        facts = [project_data(model, f) for f in ("distributed", "samples", "sets", "hands")]
        return facts == [True, False, False, False]

    @staticmethod
    def _in_distributed_branch(model: FileModel, call: ast.Call) -> bool:
        for anc in model.ancestors(call):
            if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return False
            if isinstance(anc, (ast.If, ast.IfExp)) and mentions_rank(ast.walk(anc.test)):
                return True
        return False
