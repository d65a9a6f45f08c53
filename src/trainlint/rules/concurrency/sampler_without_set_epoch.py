"""TL504 sampler-without-set-epoch."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.data_parallel import project_sets_epoch, reads_held_out
from trainlint.analysis.loaders import loops_iterating, reaching_keys
from trainlint.analysis.model import FileModel, is_false, keyword
from trainlint.analysis.objects import Obj, Objects, objects
from trainlint.analysis.roles import Role
from trainlint.analysis.torch_table import LOADER_PREPARE_METHODS
from trainlint.rules.base import Invalid, Report, Rule

DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
DATA_LOADER = "torch.utils.data.DataLoader"


class SamplerWithoutSetEpoch(Rule):
    """## What it does
    Flags a `DistributedSampler` whose data is iterated in an epoch loop (through the
    `DataLoader` it is passed to as `sampler=`, also once that loader is returned by a
    same-file factory, stored on a trainer object or kept in a dict of loaders by split,
    or directly) when `set_epoch` is never called on it, nor on `loader.sampler`,
    anywhere in the file. A loader (or sampler) that leaves the file, returned by a
    helper, kept on an object or handed to another module, is reported when no file of
    the linted project calls `set_epoch` at all, unless it reads a held-out split (its
    name or its dataset's says `val`/`test`, or its loader says `shuffle=False`). Samplers built with `shuffle=False` are not reported.

    ## Why is this bad?
    `DistributedSampler` shuffles with a generator seeded by `seed + epoch`, and the
    epoch only changes when you call `sampler.set_epoch(epoch)`. Without it every epoch
    (and every run) visits the samples in exactly the same order on every rank: the
    model never sees a reshuffled dataset, which quietly hurts convergence and makes
    results look more stable than they are. Nothing warns.

    ## Example
    ```python
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        for x, y in loader:
            ...
    ```

    ## Use instead
    ```python
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            ...
    ```

    ## References
    - [torch.utils.data.distributed.DistributedSampler](https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler)
    """

    code = "TL504"
    name = "sampler-without-set-epoch"
    message = (
        "`DistributedSampler` iterated every epoch without `set_epoch(epoch)`: every epoch "
        "sees the same order; call `sampler.set_epoch(epoch)` at the start of each epoch"
    )
    triggers = ("DistributedSampler",)
    valid = [
        # set_epoch on the sampler, in the epoch loop
        """
import torch
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
for epoch in range(10):
    sampler.set_epoch(epoch)
    for x, y in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
""",
        # through `loader.sampler` (aliased import)
        """
from torch.utils.data.distributed import DistributedSampler as DS
import torch

loader = torch.utils.data.DataLoader(ds, sampler=DS(ds), batch_size=8)
for epoch in range(10):
    loader.sampler.set_epoch(epoch)
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
""",
        # through a same-file helper
        """
import torch
from torch.utils.data import DataLoader, DistributedSampler

def start_epoch(loader, epoch):
    loader.sampler.set_epoch(epoch)

train_loader = DataLoader(ds, sampler=DistributedSampler(ds))
for epoch in range(10):
    start_epoch(train_loader, epoch)
    for x in train_loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
""",
        # no shuffling to vary
        """
import torch
from torch.utils.data import DataLoader, DistributedSampler

val_loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=False))
for epoch in range(10):
    for x in val_loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
""",
        # a single pass: no epoch loop
        """
import torch
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(ds, sampler=DistributedSampler(ds))
for x in loader:
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
""",
        # the loader goes to accelerate, which sets the epoch itself
        """
import torch
from torch.utils.data import DataLoader, DistributedSampler

loader = DataLoader(ds, sampler=DistributedSampler(ds))
model, opt, loader = accelerator.prepare(model, opt, loader)
for epoch in range(10):
    for x in loader:
        opt.zero_grad()
        accelerator.backward(model(x).sum())
        opt.step()
""",
        # shadowed: `data` is a parameter, not torch.utils.data
        """
import torch

def fit(data, ds, model, opt):
    loader = torch.utils.data.DataLoader(ds, sampler=data.DistributedSampler(ds))
    for epoch in range(10):
        for x in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
""",
        # no torch: a project's own DistributedSampler
        """
class DistributedSampler:
    def __init__(self, items):
        self.items = items

sampler = DistributedSampler(items)
for epoch in range(3):
    for item in sampler.items:
        item.backward()
        optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
from torch.utils.data import DataLoader, DistributedSampler

sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
for epoch in range(10):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
""",
            line=4,
            column=11,
        ),
        # aliased module import; the loader is iterated in a helper called per epoch;
        # only the validation sampler gets set_epoch
        Invalid(
            """
import torch
from torch.utils.data import distributed as dist_data

def train_one_epoch(model, loader, opt):
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

train_sampler = dist_data.DistributedSampler(train_ds)
val_sampler = dist_data.DistributedSampler(val_ds)
train_loader = torch.utils.data.DataLoader(train_ds, sampler=train_sampler)
val_loader = torch.utils.data.DataLoader(val_ds, sampler=val_sampler)
for epoch in range(args.epochs):
    val_sampler.set_epoch(epoch)
    train_one_epoch(model, train_loader, opt)
""",
            line=10,
        ),
        # the loader sits in a dict handed to a trainer that iterates `self.dl["train"]`
        Invalid(
            """
import torch
from torch.utils.data import DataLoader, DistributedSampler

class Fit:
    def __init__(self, dl):
        self.dl = dl
    def run(self):
        for epoch in range(10):
            for x in self.dl["train"]:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

sampler = DistributedSampler(ds)
Fit(dl={"train": DataLoader(ds, sampler=sampler)}).run()
""",
            line=14,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        samplers = model.calls_to(DISTRIBUTED_SAMPLER)
        if not samplers:
            return
        query = objects(model)
        holders = self._holders(model, query, samplers)
        for sampler in samplers:
            if is_false(keyword(sampler, "shuffle")):
                continue
            seed = keyword(sampler, "seed")
            if seed is not None and not isinstance(seed, ast.Constant):
                continue  # a seed that changes (`seed=epoch`) reshuffles by itself
            s_obj = query.of(sampler)
            held_by = [h for h, s in holders if s is sampler]
            loaders = query.of(*held_by)
            # also where the loaders go: a factory's return, a trainer's `self.loaders["train"]`
            reach = frozenset().union(*(reaching_keys(model, h) for h in held_by))
            loaders = Obj(loaders.calls, loaders.keys | reach)
            if query.passed_to(loaders, LOADER_PREPARE_METHODS):
                continue
            if self._epoch_set(model, query, sampler, s_obj, loaders, holders):
                continue
            # iterated per epoch in sight, or out of sight in a project that never reseeds
            here = loaders if held_by else s_obj
            if self._iterated_per_epoch(model, query, s_obj | loaders) or (
                self._passes_elsewhere(model, query, here)
                and not reads_held_out(model, sampler, held_by)
            ):
                yield self.report(sampler)

    @staticmethod
    def _holders(
        model: FileModel, query: Objects, samplers: list[ast.Call]
    ) -> list[tuple[ast.Call, ast.Call]]:
        """(loader construction, sampler) for every `sampler=` that passes one of them."""
        out: list[tuple[ast.Call, ast.Call]] = []
        candidates = [
            *model.calls_to(DATA_LOADER),
            *(c for name, calls in model.calls.items() if "Loader" in name for c in calls),
        ]
        # which samplers a `sampler=` value can name: by construction and by bound name
        by_call = {id(sampler): [k] for k, sampler in enumerate(samplers)}
        by_key: dict[object, list[int]] = {}
        for k, sampler in enumerate(samplers):
            for key in query.of(sampler).keys:
                by_key.setdefault(key, []).append(k)
        for call in {id(c): c for c in candidates}.values():
            value = keyword(call, "sampler")
            if value is None:
                continue
            hits = by_call.get(id(value), [])
            if isinstance(value, (ast.Name, ast.Attribute)):
                hits = hits + by_key.get(model.roles.key(value), [])
            out.extend((call, samplers[k]) for k in sorted(set(hits)))
        return out

    @staticmethod
    def _epoch_set(
        model: FileModel,
        query: Objects,
        sampler: ast.Call,
        s_obj: Obj,
        loaders: Obj,
        holders: list[tuple[ast.Call, ast.Call]],
    ) -> bool:
        """Is `set_epoch` called on this sampler, on its loader (`loader.sampler`), or on
        something this file cannot tell apart from them?"""
        either = Obj((sampler,), s_obj.keys | loaders.keys)
        for call in query.method_calls("set_epoch"):
            func = call.func
            if not isinstance(func, ast.Attribute):
                return True
            recv = func.value
            if query.refers(recv, either):
                return True
            if isinstance(recv, ast.Attribute) and recv.attr in ("sampler", "batch_sampler"):
                if query.refers(recv.value, Obj((), loaders.keys)):
                    return True
                other = model.roles.lookup(recv.value)
                if (
                    other is not None
                    and other.role is Role.LOADER
                    and any(other.call is h for h, s in holders if s is not sampler)
                ):
                    continue  # another loader's sampler
                return True
            other = model.roles.lookup(recv)
            if other is not None and other.role is Role.SAMPLER and other.call is not sampler:
                continue  # another sampler
            return True
        return False

    @staticmethod
    def _passes_elsewhere(model: FileModel, query: Objects, obj: Obj) -> bool:
        """Is the loader (or the sampler) handed out of this file (returned, kept on an
        object, passed to another module's call) and never iterated here, in a project
        where nothing calls `set_epoch` at all? Whoever iterates it elsewhere cannot be
        reseeding it."""
        if project_sets_epoch(model) is not False:
            return False  # a file linted alone, or a project that reseeds somewhere
        direct, passed = loops_iterating(model, obj.calls, obj.keys, epoch_loops=True)
        if direct or passed:
            return False  # iterated here: the loops in sight decide
        return any(k[0] == "attr" for k in obj.keys) or query.escapes(obj)

    @staticmethod
    def _iterated_per_epoch(model: FileModel, query: Objects, obj: Obj) -> bool:
        """A training loop over the sampler or its loader that itself runs in a loop."""
        direct, passed = loops_iterating(model, obj.calls, obj.keys, epoch_loops=True)
        if any(model.loop_contexts(loop) for _, loop in direct):
            return True
        # `def train_one_epoch(model, loader, ...)`: the loader arrives as a parameter
        seen = {id(loop) for _, loop in direct}
        return any(
            id(loop) not in seen and (model.enclosing_loops(loop) or model.loop_contexts(site))
            for _, loop, site in passed
        )
