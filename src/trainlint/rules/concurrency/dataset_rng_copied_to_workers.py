"""TL506 dataset-rng-copied-to-workers."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.dataset_rng import held_generators
from trainlint.analysis.loaders import DATA_LOADER
from trainlint.analysis.model import FileModel, has_star_kwargs, keyword
from trainlint.rules.base import Invalid, Report, Rule


class DatasetRngCopiedToWorkers(Rule):
    """## What it does
    Flags a random generator object that a dataset creates once in `__init__`
    (`self.rng = np.random.default_rng(seed)`, `np.random.RandomState(...)`,
    `random.Random(...)`, `torch.Generator()`) and draws from while building items
    (`__getitem__`, or a method it calls), when a `DataLoader` in the same file loads
    that dataset with `num_workers` other than 0 and no `worker_init_fn`. A class that
    reseeds per worker (it calls `get_worker_info()` outside `__init__`, which runs in
    the main process) is not reported.

    ## Why is this bad?
    Each worker process gets a copy of the dataset: a copy-on-write copy with `fork`, a
    pickled one with `spawn`. Every copy of the generator starts from the same state, so
    worker 0, worker 1, ... draw the same random numbers: the "random" crops, flips and
    masks repeat across the workers' batches, and the model sees `num_workers` times
    fewer distinct augmentations than intended. PyTorch reseeds only the global RNGs in
    each worker (in torch 2.x: `random`, `torch`, and NumPy's legacy `np.random.*`
    functions) — never a generator object the dataset holds. Nothing warns.

    ## Example
    ```python
    class Crops(Dataset):
        def __init__(self, images, seed=0):
            self.images = images
            self.rng = np.random.default_rng(seed)

        def __getitem__(self, i):
            y, x = self.rng.integers(0, 32, size=2)
            return self.images[i][:, y:y + 224, x:x + 224]

    loader = DataLoader(Crops(images), batch_size=64, num_workers=8)
    ```

    ## Use instead
    ```python
    def seed_worker(worker_id):
        info = torch.utils.data.get_worker_info()
        info.dataset.rng = np.random.default_rng(info.seed)

    loader = DataLoader(Crops(images), batch_size=64, num_workers=8,
                        worker_init_fn=seed_worker)
    ```
    (or draw from `np.random`/`torch` global functions, which each worker reseeds).

    ## References
    - [DataLoader: randomness in multi-process data loading](https://pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading)
    - [Reproducibility: DataLoader workers](https://pytorch.org/docs/stable/notes/randomness.html#dataloader)
    """

    code = "TL506"
    name = "dataset-rng-copied-to-workers"
    message = (
        "`self.{attr}` is created once and copied into every DataLoader worker "
        "(`num_workers` > 0): all workers draw the same random numbers; reseed it per "
        "worker in a `worker_init_fn` (`get_worker_info().seed`)"
    )
    triggers = ("num_workers",)
    valid = [
        # the global RNGs: torch reseeds them in each worker
        """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

class Crops(Dataset):
    def __getitem__(self, i):
        y, x = np.random.randint(0, 32, size=2)
        return self.images[i][:, y:y + 224, x:x + 224]

loader = DataLoader(Crops(), batch_size=64, num_workers=8)
""",
        # a worker_init_fn reseeds the dataset's generator
        """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

def seed_worker(worker_id):
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)

class Crops(Dataset):
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def __getitem__(self, i):
        return self.rng.integers(0, 32)

loader = DataLoader(Crops(), batch_size=64, num_workers=8, worker_init_fn=seed_worker)
""",
        # no workers: one process, one generator
        """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

class Crops(Dataset):
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def __getitem__(self, i):
        return self.rng.integers(0, 32)

loader = DataLoader(Crops(), batch_size=64, num_workers=0)
""",
        # the class reseeds lazily from the worker's seed
        """
import random
import torch
from torch.utils.data import DataLoader, Dataset

class Noisy(Dataset):
    def __init__(self):
        self.rng = random.Random(0)

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        if info is not None:
            self.rng.seed(info.seed + i)
        return self.rng.random()

loader = DataLoader(Noisy(), num_workers=4)
""",
        # a generator used only to build a fixed split in __init__
        """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

class Split(Dataset):
    def __init__(self, n, seed=0):
        self.rng = np.random.default_rng(seed)
        self.order = self.rng.permutation(n)

    def __getitem__(self, i):
        return self.order[i]

loader = DataLoader(Split(100), num_workers=4)
""",
        # shadowed: `np` is a local object, not numpy
        """
import torch
from torch.utils.data import DataLoader, Dataset

class Crops(Dataset):
    def __init__(self, np):
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i):
        return self.rng.integers(0, 32)

loader = DataLoader(Crops(lib), num_workers=8)
""",
        # no torch: a project's own loader
        """
import numpy as np

class DataLoader:
    def __init__(self, ds, num_workers=0):
        self.ds = ds

class Crops:
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def __getitem__(self, i):
        return self.rng.integers(0, 32)

loader = DataLoader(Crops(), num_workers=8)
""",
    ]
    invalid = [
        Invalid(
            """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

class Crops(Dataset):
    def __init__(self, images, seed=0):
        self.images = images
        self.rng = np.random.default_rng(seed)

    def __getitem__(self, i):
        y, x = self.rng.integers(0, 32, size=2)
        return self.images[i][:, y:y + 224, x:x + 224]

loader = DataLoader(Crops(images), batch_size=64, num_workers=8)
""",
            line=8,
            column=20,
        ),
        # aliased imports; the draw happens in a helper method; the dataset goes through
        # a name; num_workers from the command line
        Invalid(
            """
import random as rnd
import torch
from torch.utils import data as tud

class SpecAugment(tud.Dataset):
    def __init__(self, files, seed):
        self.files = files
        self.gen = rnd.Random(seed)

    def _mask(self, spec):
        start = self.gen.randint(0, spec.shape[-1] - 30)
        spec[..., start:start + 30] = 0
        return spec

    def __getitem__(self, i):
        return self._mask(torch.load(self.files[i], weights_only=True))

train_set = SpecAugment(files, seed=1234)
loader = tud.DataLoader(train_set, batch_size=32, shuffle=True, num_workers=args.workers)
""",
            line=8,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        held = held_generators(model)
        if not held:
            return
        # the classes that a multi-worker loader reads, each loader resolved once
        read = {
            id(cls)
            for call in model.calls_to(DATA_LOADER)
            if (cls := self._dataset_class(model, call)) is not None
        }
        for gen in held:
            if id(gen.cls) in read:
                yield self.report(gen.creation, self.message.format(attr=gen.attr))

    @staticmethod
    def _dataset_class(model: FileModel, call: ast.Call) -> ast.ClassDef | None:
        """The same-file dataset class a loader with workers reads, if it can be told."""
        if has_star_kwargs(call) or keyword(call, "worker_init_fn") is not None:
            return None
        workers = keyword(call, "num_workers")
        if workers is None or (isinstance(workers, ast.Constant) and not workers.value):
            return None
        data = keyword(call, "dataset") or (call.args[0] if call.args else None)
        return None if data is None else _built_class(model, data)


def _built_class(model: FileModel, expr: ast.AST) -> ast.ClassDef | None:
    """The module-level class ``expr`` is an instance of: ``Cls(...)``, or a name bound
    once in its scope to one."""
    if isinstance(expr, ast.Call):
        return model.class_named(expr.func.id) if isinstance(expr.func, ast.Name) else None
    if isinstance(expr, ast.Name):
        values = [
            node.value
            for node in model.assignments_in(model.scope_of(expr))
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets)
        ]
        return _built_class(model, values[0]) if len(values) == 1 else None
    return None
