"""TL405 loader-starves-gpu."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.loaders import (
    batch_copies,
    dataset_arg,
    loader_of_loop,
    reads_from_disk_or_transforms,
)
from trainlint.analysis.model import FileModel, has_star_kwargs, is_false, keyword
from trainlint.analysis.paths import Reported
from trainlint.rules.base import Invalid, Report, Rule

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
#            collate_fn, pin_memory, ...)
_NUM_WORKERS_POS = 5
_PIN_MEMORY_POS = 7


def _argument(call: ast.Call, name: str, pos: int) -> tuple[bool, ast.expr | None]:
    """(given at all, its value)."""
    if len(call.args) > pos:
        return True, call.args[pos]
    value = keyword(call, name)
    return value is not None, value


class LoaderStarvesGpu(Rule):
    """## What it does
    Flags a `DataLoader` that a CUDA training loop iterates (the loop copies its batches
    to a device) when it loads in the training process (no `num_workers`, or 0) and
    `pin_memory` is not set, over a map-style dataset whose items cost work: a
    torchvision dataset or a same-file `Dataset` subclass with a `__getitem__`. A
    `TensorDataset` (already in memory), an `IterableDataset` and datasets the file does
    not define are not reported. Also flags, in the loop over a `DataLoader` built with
    `pin_memory=True`, a copy of the batch to the device without `non_blocking=True`.

    Off by default: whether loading in the main process starves the GPU depends on the
    per-item cost and the model's step time, which the code does not show; turn it on
    for training scripts with `--extend-select TL405`.

    ## Why is this bad?
    With `num_workers=0` each batch is read, decoded and augmented by the training
    process itself, between two steps, while the GPU sits idle: GPU utilisation of 30-50%
    on an image model is typical, and training takes twice as long without any warning.
    Worker processes prepare the next batches while the GPU computes. Pinned (page-locked)
    host memory is what lets the host-to-device copy run asynchronously; with
    `pin_memory=True` but a blocking `.to(device)` the host still waits for every copy,
    so the loader pays for pinning and the loop gains little.

    No runtime check confirms it: the time lost is a constant share of every step, not
    a slowdown over steps.

    ## Example
    ```python
    train_set = datasets.ImageFolder(root, transform=train_transforms)
    loader = DataLoader(train_set, batch_size=256, shuffle=True)
    for images, labels in loader:
        images, labels = images.cuda(), labels.cuda()
        ...
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=256, shuffle=True, num_workers=8,
                        pin_memory=True, persistent_workers=True)
    for images, labels in loader:
        images = images.cuda(non_blocking=True)
        labels = labels.cuda(non_blocking=True)
        ...
    ```

    ## References
    - [torch.utils.data: single- and multi-process data loading](https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading)
    - [Performance tuning guide: asynchronous data loading](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#enable-asynchronous-data-loading-and-augmentation)
    """

    code = "TL405"
    severity = "warning"  # costs time or reproducibility, the training itself is right
    name = "loader-starves-gpu"
    message = (
        "the DataLoader loads every batch in the training process (no `num_workers`, "
        "no `pin_memory`) while the GPU waits; pass `num_workers=` and "
        "`pin_memory=True`"
    )
    default_enabled = False
    test_files = False
    triggers = ("DataLoader",)
    valid = [
        # workers and pinned memory, non-blocking copies
        """
import torch
from torch.utils.data import DataLoader
from torchvision import datasets
ds = datasets.CIFAR10("data", train=True, transform=tf)
loader = DataLoader(ds, batch_size=128, shuffle=True, num_workers=4, pin_memory=True)
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
        # an in-memory TensorDataset, and a dataset the file does not define
        """
import torch
from torch.utils.data import DataLoader, TensorDataset
small = DataLoader(TensorDataset(X, Y), batch_size=64, shuffle=True)
other = DataLoader(build_dataset(cfg), batch_size=64)
for x, y in small:
    opt.zero_grad()
    crit(model(x.to(device)), y.to(device)).backward()
    opt.step()
for x, y in other:
    opt.zero_grad()
    crit(model(x.to(device)), y.to(device)).backward()
    opt.step()
""",
        # workers from the config, and everything passed through **kwargs
        """
import torch
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
ds = ImageFolder(root, transform=tf)
loader = DataLoader(ds, batch_size=64, num_workers=args.workers)
loader2 = DataLoader(ds, **loader_kwargs)
for x, y in loader:
    opt.zero_grad()
    crit(model(x.cuda()), y.cuda()).backward()
    opt.step()
for x, y in loader2:
    opt.zero_grad()
    crit(model(x.cuda()), y.cuda()).backward()
    opt.step()
""",
        # a CPU training loop (nothing is copied to a device), and evaluation
        """
import torch
from torch.utils.data import DataLoader
from torchvision import datasets
loader = DataLoader(datasets.MNIST("data", transform=tf), batch_size=64)
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
val = DataLoader(datasets.MNIST("data", train=False, transform=tf), batch_size=64)
with torch.no_grad():
    for x, y in val:
        acc = (model(x.cuda()).argmax(1) == y.cuda()).float().mean()
""",
        # no torch: a DataLoader class of the project's own
        """
class DataLoader:
    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size

loader = DataLoader(ImageDataset(root), batch_size=64)
for x, y in loader:
    loss = net.loss(x.to(device), y.to(device))
    loss.backward()
    opt.step()
""",
        # pinned memory with non_blocking taken from a variable
        """
import torch
from torch.utils.data import DataLoader
loader = DataLoader(ds, batch_size=32, num_workers=2, pin_memory=True)
for batch in loader:
    batch = {k: v.to(device, non_blocking=args.non_blocking) for k, v in batch.items()}
    opt.zero_grad()
    model(**batch).loss.backward()
    opt.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
train_set = datasets.ImageFolder("train", transform=transforms.ToTensor())
loader = DataLoader(train_set, batch_size=256, shuffle=True)
for images, labels in loader:
    images, labels = images.cuda(), labels.cuda()
    optimizer.zero_grad()
    criterion(model(images), labels).backward()
    optimizer.step()
""",
            line=5,
        ),
        # a same-file Dataset that decodes images, iterated through enumerate and tqdm,
        # with num_workers=0 spelled out
        Invalid(
            """
import torch
from torch.utils import data as tud
from tqdm import tqdm
from PIL import Image

class Frames(tud.Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return tf(Image.open(self.paths[i]))

def train(model, paths, opt, device):
    loader = tud.DataLoader(Frames(paths), batch_size=16, num_workers=0)
    for step, frames in enumerate(tqdm(loader)):
        frames = frames.to(device)
        opt.zero_grad()
        model(frames).mean().backward()
        opt.step()
""",
            line=17,
        ),
        # pinned memory, but the copies block
        Invalid(
            """
import torch
from torch.utils.data import DataLoader
loader = DataLoader(ds, batch_size=32, num_workers=4, pin_memory=True)
for batch in loader:
    x, y = batch
    x = x.to(device)
    y = y.to(device, non_blocking=True)
    batch = {k: v.cuda() for k, v in extra.items()}
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        seen = Reported()
        for loop in model.steps.statement_loops:
            binding = loader_of_loop(model, loop)
            if binding is None or binding.call is None or has_star_kwargs(binding.call):
                continue
            copies = batch_copies(model, loop)
            if not copies:
                continue  # not copied to a device in the loop: a CPU loop, or done elsewhere
            ctor = binding.call
            workers_given, workers = _argument(ctor, "num_workers", _NUM_WORKERS_POS)
            pin_given, pin = _argument(ctor, "pin_memory", _PIN_MEMORY_POS)
            no_workers = not workers_given or (
                isinstance(workers, ast.Constant) and workers.value == 0
            )
            if no_workers and not pin_given:
                dataset = dataset_arg(ctor)
                if dataset is not None and reads_from_disk_or_transforms(model, dataset):
                    if seen.first(ctor):
                        yield self.report(ctor)
            if isinstance(pin, ast.Constant) and pin.value is True:
                for copy in copies:
                    if keyword(copy, "non_blocking") is None and not _positional_flag(copy):
                        if seen.first(copy):
                            yield self.report(
                                copy,
                                (
                                    "the loader pins its batches (`pin_memory=True`), but this "
                                    "copy blocks: pass `non_blocking=True`"
                                ),
                            )
                    elif is_false(keyword(copy, "non_blocking")) and seen.first(copy):
                        yield self.report(
                            copy,
                            (
                                "the loader pins its batches (`pin_memory=True`), but this copy "
                                "blocks (`non_blocking=False`)"
                            ),
                        )


def _positional_flag(copy: ast.Call) -> bool:
    """``x.cuda(device, True)`` / ``x.to(device, dtype, True)``: non_blocking positionally."""
    func = copy.func
    name = func.attr if isinstance(func, ast.Attribute) else ""
    return len(copy.args) >= (2 if name == "cuda" else 3)
