"""TL502 module-sent-to-process."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.escape_callers import used_by_callers
from trainlint.analysis.escape_targets import moves_first
from trainlint.analysis.escapes import Via, may_dispatch_processes
from trainlint.analysis.model import FileModel, dotted
from trainlint.analysis.objects import objects
from trainlint.analysis.roles import Role
from trainlint.rules.base import Invalid, Report, Rule
from trainlint.rules.concurrency._shared import shown


def _names(exprs: list[ast.expr]) -> str:
    names = sorted({dotted(e) or "?" for e in exprs})
    return ", ".join(f"`{n}`" for n in names)


def _expr_named(exprs: list[ast.expr], name: str) -> ast.expr:
    return next(e for e in exprs if dotted(e) == name)


class ModuleSentToProcess(Rule):
    """## What it does
    Flags a `multiprocessing`/`torch.multiprocessing` process started with a model (or
    its optimizer) as argument (`Process(target=train, args=(model,))`) whose target
    trains it, when the parent uses the model afterwards (in the same function, or in
    a caller of the function that starts the processes, in this file or another of the
    project), `model.share_memory()` was not called, and the file does not select the
    `spawn` or `forkserver` start method. A target imported from another module counts
    by what that module says it trains.
    Also flags any process creation (`Process`, `Pool.map/apply_async/starmap`,
    `torch.multiprocessing.spawn`) whose target moves the received model to another
    device or dtype (`model.to(rank)`, `model.cuda()`) before training it.

    ## Why is this bad?
    Whether the parent sees the training depends on how the child got the model.
    With `fork` (the Linux default before Python 3.14) a `Process` child trains a
    copy-on-write copy: the parent's model never changes, its evaluation and checkpoint
    use the initial weights, and every worker's loss still goes down. With `spawn` or
    `forkserver` (and for arguments sent to a `Pool` or `torch.multiprocessing.spawn`),
    torch's pickler moves the argument tensors into shared memory, so the parent does
    see the updates (Hogwild) — unless the child moves the model with `.to(device)`,
    which trains a private copy on that device again. The same script thus trains or
    silently does not, depending on the platform and Python version.

    ## Example
    ```python
    model = Net()
    processes = [mp.Process(target=train, args=(model,)) for _ in range(4)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    test(model)  # untrained under fork
    ```

    ## Use instead
    Share the parameters explicitly before starting the processes:
    ```python
    model = Net()
    model.share_memory()
    processes = [mp.Process(target=train, args=(model,)) for _ in range(4)]
    ```
    and when the worker moves the model to its GPU, send the trained `state_dict()` back
    (a queue, a file written by rank 0) and load it in the parent.

    ## References
    - [Multiprocessing best practices: Hogwild](https://pytorch.org/docs/stable/notes/multiprocessing.html#hogwild)
    - [torch.multiprocessing](https://pytorch.org/docs/stable/multiprocessing.html)
    - [Python 3.14 changes the default start method](https://docs.python.org/3.14/library/multiprocessing.html#contexts-and-start-methods)
    """

    code = "TL502"
    name = "module-sent-to-process"
    message = (
        "the child process may train a copy of this model; the parent's weights may not change"
    )
    severity = "warning"
    triggers = ("Process", "spawn", "Pool", "start_processes")
    confirm_with = "assert_weights_updated"
    valid = [
        # Hogwild: parameters shared explicitly before the processes start
        """
import torch
import torch.multiprocessing as mp

def train(model, loader):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.nll_loss(model(x), y).backward()
        opt.step()

model = torch.nn.Linear(4, 2)
model.share_memory()
processes = []
for rank in range(4):
    p = mp.Process(target=train, args=(model, loader))
    p.start()
    processes.append(p)
for p in processes:
    p.join()
test(model)
""",
        # the file selects spawn: torch shares the argument tensors
        """
import torch
import multiprocessing as mp

def train(model, loader):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

if __name__ == "__main__":
    mp.set_start_method("spawn")
    model = torch.nn.Linear(4, 2)
    p = mp.Process(target=train, args=(model, loader))
    p.start()
    p.join()
    test(model)
""",
        # an explicit forkserver context
        """
import torch
import multiprocessing

def train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()

ctx = multiprocessing.get_context("forkserver")
model = torch.nn.Linear(4, 2)
p = ctx.Process(target=train, args=(model,))
p.start()
p.join()
test(model)
""",
        # a pool pickles its arguments into shared memory (aliased import)
        """
import torch
from torch.multiprocessing import Pool as TorchPool

def train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

model = torch.nn.Linear(4, 2)
with TorchPool(4) as pool:
    pool.map(train, [model] * 4)
test(model)
""",
        # torch.multiprocessing.spawn shares the model, which the worker trains in place
        """
import torch
import torch.multiprocessing as mp

def worker(rank, model, loader):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in loader:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

model = torch.nn.Linear(4, 2)
mp.spawn(worker, args=(model, loader), nprocs=2)
test(model)
""",
        # the child sends its state dict back through a queue
        """
import torch
import torch.multiprocessing as mp

def train(model, q):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    q.put(model.state_dict())

model = torch.nn.Linear(4, 2)
q = mp.Queue()
p = mp.Process(target=train, args=(model, q))
p.start()
model.load_state_dict(q.get())
p.join()
test(model)
""",
        # the parent never looks at the model again (the child saves its own checkpoint)
        """
import torch
import torch.multiprocessing as mp

def train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    torch.save(model.state_dict(), "child.pt")

model = torch.nn.Linear(4, 2)
p = mp.Process(target=train, args=(model,))
p.start()
p.join()
""",
        # the child only evaluates
        """
import torch
import torch.multiprocessing as mp

def evaluate(model, loader):
    with torch.no_grad():
        return sum(model(x).sum() for x in loader)

model = torch.nn.Linear(4, 2)
p = mp.Process(target=evaluate, args=(model, loader))
p.start()
p.join()
print(model)
""",
        # shadowed: `mp` is a parameter
        """
import torch

def train(model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()

def launch(mp, model):
    p = mp.Process(target=train, args=(model,))
    p.start()
    p.join()
    test(model)
""",
        # no torch, no multiprocessing: a local Process class
        """
class Process:
    def __init__(self, target, args):
        self.target, self.args = target, args

def train(model, optimizer):
    optimizer.step()

p = Process(target=train, args=(model, optimizer))
print(model)
""",
    ]
    invalid = [
        # fork (the default), no share_memory, the parent tests the model
        Invalid(
            """
import torch
import torch.multiprocessing as mp

def train(rank, model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(10):
        train_epoch(model, loader, optimizer)

def train_epoch(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        torch.nn.functional.nll_loss(model(x), y).backward()
        optimizer.step()

model = torch.nn.Linear(4, 2)
processes = []
for rank in range(4):
    p = mp.Process(target=train, args=(rank, model, loader))
    p.start()
    processes.append(p)
for p in processes:
    p.join()
test(model)
""",
            line=18,
        ),
        # stdlib multiprocessing, an explicit fork context
        Invalid(
            """
import multiprocessing
import torch

def fit(model, optimizer, batches):
    for x in batches:
        optimizer.zero_grad()
        model(x).mean().backward()
        optimizer.step()

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.Adam(model.parameters())
ctx = multiprocessing.get_context("fork")
worker = ctx.Process(target=fit, kwargs={"model": model, "optimizer": optimizer, "batches": b})
worker.start()
worker.join()
torch.save(model.state_dict(), "model.pt")
""",
            line=13,
        ),
        # spawn shares the model, but the worker moves it to its GPU first
        Invalid(
            """
import torch
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def worker(rank, world_size, model, loader):
    model = model.to(rank)
    ddp = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()

model = torch.nn.Linear(4, 2)
mp.spawn(worker, args=(4, model, loader), nprocs=4)
torch.save(model.state_dict(), "final.pt")
""",
            line=15,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not may_dispatch_processes(model):
            return
        esc = objects(model).escape_analysis
        for d in esc.process_dispatches:
            if d.target is None:
                continue
            trained = esc.trained_params(d)
            sent = [
                (p, obj)
                for p, arg in d.args
                if p in trained and (obj := esc.sent_object(arg, through_put=False)) is not None
            ]
            if not sent:
                continue
            objs = [obj for _, obj in sent]
            names = esc.caller_names(objs)
            if esc.loaded_back(d.call, names):
                continue
            # the parent's use may be in the caller of the function that started them
            if not esc.used_after(d.call, names, loops=False) and not used_by_callers(
                esc, d.call, names
            ):
                continue
            moved = [
                obj
                for p, obj in sent
                if esc.copies_before_training(d.target, p) or moves_first(d.target, p)
            ]
            if moved:
                yield self.report(
                    d.call,
                    f"`{d.name}` moves {_names(moved)} to another device or dtype before "
                    "training it: the child trains its own copy and the parent's weights "
                    "never change; send the trained `state_dict()` back and load it",
                )
                continue
            if d.via is not Via.PROCESS or d.start_method != "fork":
                continue  # pools and spawn/forkserver pickle tensors into shared memory
            if esc.shares_memory(names):
                continue
            models = sorted(
                n
                for n in names
                if n not in {dotted(o) for o in objs}
                or esc.roles.role(_expr_named(objs, n)) is Role.MODEL
            )
            target = models[0] if models else "model"
            yield self.report(
                d.call,
                f"{shown(names)} trained in the child process `{d.name}`: with `fork` (the "
                "Linux default before Python 3.14) the parent's copy never changes; with "
                "`spawn`/`forkserver` torch shares the tensors. Call "
                f"`{target}.share_memory()` before starting the process",
            )
