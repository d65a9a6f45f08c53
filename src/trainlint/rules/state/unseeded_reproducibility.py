"""TL703 unseeded-reproducibility."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.dominance import dominates
from trainlint.analysis.model import FileModel
from trainlint.analysis.seeding import (
    determinism_claims,
    model_constructions,
    seed_calls,
    seeds_torch,
)
from trainlint.rules.base import Invalid, Report, Rule


class UnseededReproducibility(Rule):
    """## What it does
    Flags a training script that asks for reproducibility without seeding:
    it sets `torch.backends.cudnn.deterministic = True` or calls
    `torch.use_deterministic_algorithms(True)`, yet nothing in the file seeds a random
    generator (no `torch.manual_seed`, `np.random.seed`, `random.seed`, `seed_everything`,
    `set_seed` or other call named for seeding). Reported at the claim.

    Also flags a torch seed (`torch.manual_seed`, `seed_everything`, `set_seed`, or a
    same-file helper that calls one) that comes after a randomly initialised model (a
    same-file `nn.Module` subclass or a `torch.nn` layer) was built in the same function,
    when nothing seeded before it. Reported at the seed. Pretrained models and models
    from unknown factories are not considered, nor files that seed anywhere else.

    Off by default: scripts that do not claim reproducibility are not wrong to leave it
    out, and only the file is read, not the entry point that may seed before it; turn it
    on with `--extend-select TL703` for experiment code that must be repeatable.

    ## Why is this bad?
    Deterministic kernels only make a run repeatable if the random numbers are the same
    too: without a seed, the initial weights, dropout masks, data order and
    augmentations differ on every run, so the script pays the speed cost of
    deterministic cuDNN and still cannot reproduce a result. A seed set after the model
    was built comes too late for its initial weights: two runs "with the same seed"
    start from different models and diverge, and the seed looks like it works because
    the data order is repeatable.

    No runtime check confirms it: it needs two runs of the whole script to compare.

    ## Example
    ```python
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    model = Net().cuda()
    torch.manual_seed(args.seed)
    ```

    ## Use instead
    ```python
    torch.manual_seed(args.seed)  # also np.random.seed / random.seed when used
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    model = Net().cuda()
    ```

    ## References
    - [PyTorch: Reproducibility](https://pytorch.org/docs/stable/notes/randomness.html)
    - [torch.use_deterministic_algorithms](https://pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html)
    """

    code = "TL703"
    severity = "warning"  # costs time or reproducibility, the training itself is right
    name = "unseeded-reproducibility"
    message = (
        "deterministic algorithms are requested but nothing seeds the random "
        "generators: runs still differ; seed torch (and numpy/random if used)"
    )
    default_enabled = False
    test_files = False
    triggers = ("deterministic", "seed")
    valid = [
        # seeded first, then deterministic
        """
import random
import numpy as np
import torch
random.seed(0)
np.random.seed(0)
torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
model = Net()
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
        # a project's own seeding helper, under another name; deterministic switched off
        """
import torch
import utils
utils.init_seeds(args.seed)
torch.backends.cudnn.deterministic = False
torch.use_deterministic_algorithms(mode=args.det)
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
        # seeded after a pretrained model (its weights come from the checkpoint)
        """
import torch
from transformers import AutoModelForCausalLM, set_seed
model = AutoModelForCausalLM.from_pretrained(name)
set_seed(args.seed)
for batch in loader:
    model(**batch).loss.backward()
    opt.step()
""",
        # seeded before the model in a caller
        """
import torch
from torch import nn

class Net(nn.Module):
    pass

def run(cfg):
    model = Net()
    torch.manual_seed(cfg.data_seed)
    for x in loader:
        model(x).sum().backward()
        opt.step()

torch.manual_seed(0)
run(cfg)
""",
        # a function no code in this file calls (its caller may seed first), and a seed
        # per run of a sweep
        """
import torch
from torch import nn

def train(cfg):
    model = nn.Linear(4, 2)
    torch.manual_seed(cfg.seed)
    for x, y in loader:
        model(x).sum().backward()
        opt.step()

for seed in range(3):
    net = nn.Linear(4, 2)
    torch.manual_seed(seed)
""",
        # no torch: a module-level name `deterministic` of its own
        """
deterministic = True
model = Net()
for x in data:
    model.step(x)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
import torch.backends.cudnn as cudnn
cudnn.deterministic = True
cudnn.benchmark = False
model = Net().cuda()
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
            line=3,
        ),
        Invalid(
            """
import torch
torch.use_deterministic_algorithms(True)
for x, y in loader:
    opt.zero_grad()
    crit(model(x), y).backward()
    opt.step()
""",
            line=2,
        ),
        # the seed comes after the model is built
        Invalid(
            """
import torch
from torch import nn
from lightning import seed_everything

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

def main(args):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seed_everything(args.seed)
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

if __name__ == "__main__":
    main(parse_args())
""",
            line=13,
        ),
        # a same-file helper that seeds torch, called after a torch.nn model is built
        Invalid(
            """
import random
import torch
import torch.nn as nn

def set_all_seeds(seed):
    random.seed(seed)
    torch.manual_seed(seed)

net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
set_all_seeds(1234)
opt = torch.optim.Adam(net.parameters())
for x, y in loader:
    opt.zero_grad()
    nn.functional.mse_loss(net(x), y).backward()
    opt.step()
""",
            line=10,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch") or not model.steps.step_loops:
            return
        seeds = seed_calls(model)
        if not seeds:
            claims = determinism_claims(model)
            if claims:
                yield self.report(claims[0])
            return
        yield from self._late_seeds(model, seeds)

    def _late_seeds(self, model: FileModel, seeds: list[ast.Call]) -> Iterator[Report]:
        # the body of a seeding helper (`def set_seed(s): torch.manual_seed(s)`) is
        # counted where the helper is called
        seeds = [s for s in seeds if "seed" not in getattr(model.function_of(s), "name", "")]
        if not seeds:
            return
        scopes = {id(model.function_of(s) or model.tree) for s in seeds}
        if len(scopes) != 1:
            return  # seeded in several places: a caller may seed before this one builds
        torch_seeds = [s for s in seeds if seeds_torch(model, s)]
        if not torch_seeds:
            return
        first = torch_seeds[0]
        scope = model.function_of(first) or model.tree
        if model.enclosing_loops(first):
            return  # a seed per run of a sweep
        if scope is not model.tree and not model.call_sites.get(id(scope)):
            return  # called from another file, which may seed before calling it
        built = [
            m
            for m in model_constructions(model, scope)
            if (m.lineno, m.col_offset) < (first.lineno, first.col_offset)
            and dominates(model, model.statement_of(m), first)
        ]
        if not built:
            return
        yield self.report(
            first,
            (
                f"the seed comes after the model was built on line {built[0].lineno}: its initial "
                "weights are not reproducible; seed before building the model"
            ),
        )
