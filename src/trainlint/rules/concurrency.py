"""TL5: processes, threads, clusters. Models trained where the caller cannot see it,
shared models trained on several threads, and distributed samplers that never reshuffle."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator

from trainlint.analysis.escapes import Dispatch, Escapes, Touch, Via, escapes, params_of
from trainlint.analysis.model import (
    FileModel,
    FunctionNode,
    dotted,
    is_false,
    keyword,
    walk_local,
)
from trainlint.analysis.roles import Key, Role
from trainlint.analysis.steps import Event, Kind
from trainlint.rules.base import Invalid, Report, Rule
from trainlint.rules.gradients import grad_enabled_at

DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
DATA_LOADER = "torch.utils.data.DataLoader"
# Frameworks that take over the loader call `set_epoch` themselves (accelerate's
# DataLoaderShard, Fabric, Lightning).
_PREPARE_METHODS = {"prepare", "prepare_data_loader", "setup_dataloaders", "setup"}


def _names(exprs: list[ast.expr]) -> str:
    names = sorted({dotted(e) or "?" for e in exprs})
    return ", ".join(f"`{n}`" for n in names)


def _shown(names: set[str]) -> str:
    """"`model` is" / "`model`, `opt` are", for messages."""
    listed = ", ".join(f"`{n}`" for n in sorted(names))
    return listed + (" are" if len(names) > 1 else " is")


class ModuleSentToRemote(Rule):
    """## What it does
    Flags a Ray remote call (`train.remote(model, opt)`, `Actor.remote(model, opt)`,
    `f.options(...).remote(...)`, `handle.method.remote(model)`, or an object put with
    `ray.put(model)` and then passed) that hands an `nn.Module` or optimizer to a remote
    function or actor which trains it (steps an optimizer over its parameters), when the
    caller keeps using its model and never loads the weights back
    (`model.load_state_dict(ray.get(...))`) nor rebinds the name to the returned model.

    ## Why is this bad?
    Ray pickles every argument: the remote worker trains a copy in another process.
    `loss.backward()` and `optimizer.step()` run there, on that copy; the caller's model
    does not move, and nothing raises. The script then evaluates, checkpoints or sends
    out again (each round restarting from the same initial weights) a model that was
    never trained, and the loss curves of the workers look perfectly healthy.

    ## Example
    ```python
    @ray.remote
    def train_step(model, optimizer, data, labels):
        optimizer.zero_grad()
        loss_fn(model(data), labels).backward()
        optimizer.step()

    for epoch in range(epochs):
        ray.get(train_step.remote(model, optimizer, data, labels))
    torch.save(model.state_dict(), "model.pt")  # the initial weights
    ```

    ## Use instead
    Return the trained weights and load them back (or keep the model in an actor and
    fetch its `state_dict()` when you need it):
    ```python
    @ray.remote
    def train_step(model, optimizer, data, labels):
        ...
        return model.state_dict()

    for epoch in range(epochs):
        model.load_state_dict(ray.get(train_step.remote(model, optimizer, data, labels)))
    ```
    or compute gradients remotely and apply them with the caller's optimizer.

    ## References
    - [Ray: passing objects to tasks (arguments are copied)](https://docs.ray.io/en/latest/ray-core/objects.html)
    - [Ray Train with PyTorch](https://docs.ray.io/en/latest/train/getting-started-pytorch.html)
    """

    code = "TL501"
    name = "module-sent-to-remote"
    message = "the Ray remote trains a copy of this model; the caller's weights never change"
    triggers = ("remote",)
    confirm_with = "assert_weights_updated"
    valid = [
        # the trained state dict is sent back and loaded
        """
import ray
import torch

@ray.remote
def train(model, opt, batches):
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model.state_dict()

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    ref = train.remote(model, opt, batches)
    model.load_state_dict(ray.get(ref))
evaluate(model)
""",
        # the remote only predicts (aliased import)
        """
import ray as r
import torch

@r.remote(num_gpus=1)
def predict(model, batch):
    with torch.no_grad():
        return model(batch)

model = torch.nn.Linear(4, 1)
preds = r.get([predict.remote(model, b) for b in batches])
print(model)
""",
        # gradients computed remotely, applied by the caller's optimizer
        """
import ray
import torch

@ray.remote
def compute_gradients(model, x, y):
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches:
    grads = ray.get(compute_gradients.remote(model, x, y))
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    opt.step()
""",
        # the remote gets a state dict and builds its own model
        """
import ray
import torch

@ray.remote
def fit(state, data):
    model = Net()
    model.load_state_dict(state)
    opt = torch.optim.Adam(model.parameters())
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return model.state_dict()

model = Net()
opt = torch.optim.Adam(model.parameters())
new_state = ray.get(fit.remote(model.state_dict(), data))
model.load_state_dict(new_state)
""",
        # the caller takes the trained model the remote returns
        """
import ray
import torch

@ray.remote
def train(model, opt, data):
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return model

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = ray.get(train.remote(model, opt, data))
torch.save(model.state_dict(), "model.pt")
""",
        # the actor trains its own model; the caller fetches the weights back
        """
import ray
import torch

@ray.remote
class Trainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer

    def train_step(self, x):
        self.optimizer.zero_grad()
        self.model(x).sum().backward()
        self.optimizer.step()

    def weights(self):
        return self.model.state_dict()

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
trainer = Trainer.remote(model, optimizer)
ray.get(trainer.train_step.remote(x))
model.load_state_dict(ray.get(trainer.weights.remote()))
evaluate(model)
""",
        # a sweep: every trial gets the same initial weights on purpose, and the driver
        # keeps only the scores
        """
import ray
import torch

@ray.remote
def trial(model, lr, data):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return score(model)

model = torch.nn.Linear(4, 1)
ref = ray.put(model)
scores = ray.get([trial.remote(ref, lr, data) for lr in (0.1, 0.01)])
""",
        # shadowed: `ray` is a parameter, not the Ray module
        """
import torch

def launch(ray, model, opt, data):
    @ray.remote
    def train(model, opt):
        for x in data:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    ray.get(train.remote(model, opt))
    evaluate(model)
""",
        # no Ray at all: a git-like `remote` API
        """
class Repo:
    def remote(self, *args):
        return args

def train(model, optimizer):
    optimizer.step()

train = Repo()
train.remote(model, optimizer)
print(model)
""",
    ]
    invalid = [
        # the seed's first example: the caller prints its (unchanged) weights
        Invalid(
            """
import ray
import torch.nn as nn
import torch.optim as optim

@ray.remote
def train_step(model, optimizer, data, labels):
    optimizer.zero_grad()
    loss = nn.MSELoss()(model(data), labels)
    loss.backward()
    optimizer.step()
    return model

model = nn.Linear(10, 1)
optimizer = optim.SGD(model.parameters(), lr=0.01)
trained_model = ray.get(train_step.remote(model, optimizer, data, labels))
print(list(model.parameters())[0])
""",
            line=15,
            column=25,
        ),
        # an actor built with the model (aliased import, `.options(...)`)
        Invalid(
            """
from ray import remote as ray_remote
import ray
import torch

@ray_remote
class TrainerActor:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()

model = torch.nn.Linear(10, 1)
trainer = TrainerActor.options(num_gpus=1).remote(model, 0.01)
for x, y in loader:
    ray.get(trainer.train_step.remote(x, y))
torch.save(model.state_dict(), "final.pt")
""",
            line=17,
        ),
        # `ray.put(model)` then passed every epoch; the caller evaluates its unchanged copy
        Invalid(
            """
import ray
import torch

def fit_epoch(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

remote_fit = ray.remote(fit_epoch)
model = torch.nn.Linear(8, 2)
ref = ray.put(model)
for epoch in range(10):
    ray.get(remote_fit.remote(ref, loader))
    print(epoch, evaluate(model))
""",
            line=15,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        esc = escapes(model)
        for d in esc.remote_dispatches:
            sent = _trained_objects(esc, d, through_put=True)
            if not sent:
                continue
            names = esc.caller_names(sent)
            if esc.loaded_back(d.call, names) or not esc.used_after(d.call, names, loops=True):
                continue
            yield self.report(
                d.call,
                f"{_shown(names)} trained inside the {d.via.value} `{d.name}`, on a copy: "
                "the caller's weights never change; return the `state_dict()` and "
                "`load_state_dict(ray.get(...))` it",
            )


def _trained_objects(esc: Escapes, d: Dispatch, *, through_put: bool) -> list[ast.expr]:
    """The caller's models/optimizers that the dispatched function trains."""
    trained = esc.trained_params(d)
    out = []
    for param, arg in d.args:
        if param in trained:
            obj = esc.sent_object(arg, through_put=through_put)
            if obj is not None:
                out.append(obj)
    return out


class ModuleSentToProcess(Rule):
    """## What it does
    Flags a `multiprocessing`/`torch.multiprocessing` process started with a model (or
    its optimizer) as argument (`Process(target=train, args=(model,))`) whose target
    trains it, when the parent uses the model afterwards, `model.share_memory()` was
    not called, and the file does not select the `spawn` or `forkserver` start method.
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
    message = "the child process may train a copy of this model; the parent's weights may not change"
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
        esc = escapes(model)
        for d in esc.process_dispatches:
            if d.target is None:
                continue
            trained = esc.trained_params(d)
            sent = [(p, obj) for p, arg in d.args if p in trained
                    and (obj := esc.sent_object(arg, through_put=False)) is not None]
            if not sent:
                continue
            objs = [obj for _, obj in sent]
            names = esc.caller_names(objs)
            if not esc.used_after(d.call, names, loops=False) or esc.loaded_back(d.call, names):
                continue
            moved = [obj for p, obj in sent if esc.copies_before_training(d.target, p)]
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
            models = sorted(n for n in names if n not in {dotted(o) for o in objs}
                            or esc.roles.role(_expr_named(objs, n)) is Role.MODEL)
            target = models[0] if models else "model"
            yield self.report(
                d.call,
                f"{_shown(names)} trained in the child process `{d.name}`: with `fork` (the "
                "Linux default before Python 3.14) the parent's copy never changes; with "
                "`spawn`/`forkserver` torch shares the tensors. Call "
                f"`{target}.share_memory()` before starting the process",
            )


def _expr_named(exprs: list[ast.expr], name: str) -> ast.expr:
    return next(e for e in exprs if dotted(e) == name)


class UnlockedSharedModel(Rule):
    """## What it does
    Flags a forward, `backward()` or optimizer step, inside a function that runs on
    several threads at once (`threading.Thread(target=f)` in a loop or more than once,
    `ThreadPoolExecutor.submit/map(f, ...)`, `ThreadPool.map`), on a model or optimizer
    that all those threads share (a module global, a closure variable, a `self`
    attribute of the same object, or the same object passed to each thread), when the
    call is not inside `with lock:` on a `threading.Lock`/`RLock`.

    ## Why is this bad?
    Threads share memory and PyTorch releases the GIL inside its kernels. One thread's
    `optimizer.step()` rewrites the parameters in place while another thread's forward
    reads them and its backward accumulates into the same `.grad` tensors; another
    thread's `zero_grad()` wipes gradients in between. The result is gradients from
    mixed weights, torn updates and, sooner or later, NaN in the weights — only with
    two or more threads, so it passes every single-threaded test.

    ## Example
    ```python
    def worker(shard):
        for x, y in shard:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()

    threads = [threading.Thread(target=worker, args=(s,)) for s in shards]
    ```

    ## Use instead
    Serialise the training step with one lock (or give each thread its own model and
    average the gradients):
    ```python
    lock = threading.Lock()

    def worker(shard):
        for x, y in shard:
            with lock:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
    ```

    ## References
    - [Autograd: thread safety](https://pytorch.org/docs/stable/notes/autograd.html#multithreading)
    - [threading.Lock](https://docs.python.org/3/library/threading.html#lock-objects)
    """

    code = "TL503"
    name = "unlocked-shared-model"
    message = "a model shared by several threads is trained without a lock"
    triggers = ("Thread",)
    confirm_with = "assert_thread_safe"
    valid = [
        # the whole step under one lock
        """
import threading
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
lock = threading.Lock()

def worker(shard):
    for x, y in shard:
        with lock:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()

threads = [threading.Thread(target=worker, args=(s,)) for s in shards]
""",
        # inference threads under no_grad
        """
import threading
import torch

model = torch.nn.Linear(4, 1)

def serve(requests):
    with torch.no_grad():
        for x in requests:
            reply(model(x))

for q in queues:
    threading.Thread(target=serve, args=(q,)).start()
""",
        # each thread builds its own model and optimizer
        """
import threading
import torch

def worker(shard):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in shard:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

for s in shards:
    threading.Thread(target=worker, args=(s,)).start()
""",
        # each thread gets a different model (aliased import, RLock through a parameter)
        """
from concurrent.futures import ThreadPoolExecutor as TPE
import torch

def fit(model, shard):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in shard:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

with TPE(max_workers=4) as ex:
    futures = [ex.submit(fit, torch.nn.Linear(4, 1), s) for s in shards]
""",
        # every thread is joined before the next one starts
        """
import threading
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def worker(shard):
    for x in shard:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

for s in shards:
    t = threading.Thread(target=worker, args=(s,))
    t.start()
    t.join()
""",
        # the lock is passed in and held around a helper that trains
        """
import threading
import torch

def step(model, opt, x):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()

def worker(model, opt, shard, lock):
    for x in shard:
        with lock:
            step(model, opt, x)

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
lock = threading.RLock()
for s in shards:
    threading.Thread(target=worker, args=(model, opt, s, lock)).start()
""",
        # shadowed: `threading` is a parameter
        """
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def worker():
    model(x).sum().backward()
    opt.step()

def start(threading):
    for _ in range(4):
        threading.Thread(target=worker).start()
""",
        # no torch: a simulation stepped from threads
        """
import threading

def worker(sim):
    for _ in range(100):
        optimizer.step()
        sim.backward()

for _ in range(4):
    threading.Thread(target=worker, args=(world,)).start()
""",
    ]
    invalid = [
        # module globals trained from a loop of threads, as in the seed
        Invalid(
            """
import threading
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def worker(shard):
    for x, y in shard:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()

threads = []
for s in shards:
    t = threading.Thread(target=worker, args=(s,))
    t.start()
    threads.append(t)
""",
            lines=(10, 11, 12),
        ),
        # the same model and optimizer submitted to a pool (aliased import)
        Invalid(
            """
from concurrent.futures import ThreadPoolExecutor as Pool
import torch

def fit(model, opt, shard):
    for x in shard:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

model = torch.nn.Linear(4, 1)
opt = torch.optim.Adam(model.parameters())
with Pool(8) as pool:
    for shard in shards:
        pool.submit(fit, model, opt, shard)
""",
            lines=(7, 8),
        ),
        # `self` attributes, a helper doing the step, a lock created inside the `with`
        Invalid(
            """
import threading
import torch

class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def _step(self, x):
        self.opt.zero_grad()
        self.model(x).sum().backward()
        self.opt.step()

    def _work(self, shard):
        for x in shard:
            with threading.Lock():
                self._step(x)

    def fit(self, shards):
        threads = [threading.Thread(target=self._work, args=(s,)) for s in shards]
        for t in threads:
            t.start()
""",
            lines=(11, 12),
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        esc = escapes(model)
        groups: dict[int, list[Dispatch]] = defaultdict(list)
        for d in esc.thread_dispatches:
            if d.target is not None and not d.serial:
                groups[id(d.target)].append(d)
        seen: set[int] = set()
        for ds in groups.values():
            fn = ds[0].target
            if fn is None or (len(ds) < 2 and not ds[0].repeated):
                continue
            for node, what, shared in self._unlocked(model, esc, fn, ds):
                # one finding per statement: `model(x).sum().backward()` is one place to lock
                stmt = model.statement_of(node)
                if id(stmt) not in seen:
                    seen.add(id(stmt))
                    yield self.report(
                        node,
                        f"{what} on {shared}, shared by every thread running `{fn.name}`, "
                        "without a lock: concurrent backward/step on shared parameters races "
                        "(NaN or wrong gradients); hold a `threading.Lock` around the step",
                    )

    @staticmethod
    def _unlocked(model: FileModel, esc: Escapes, fn: FunctionNode,
                  ds: list[Dispatch]) -> Iterator[tuple[ast.AST, str, str]]:
        events = esc.events(fn, Kind.BACKWARD, Kind.STEP)
        if not events:
            return  # forward-only threads (inference) write no parameters
        helpers = [fn, *(h for e in events for c in e.chain
                         if (h := model.resolve_call(c)) is not None)]
        if esc.acquires(helpers):
            return  # manual acquire()/release(): the locked region cannot be told
        sharing = _Sharing(esc, fn, ds)
        forwards = [(c, name) for c in walk_local(fn) if isinstance(c, ast.Call)
                    and (name := sharing.forwarded(c)) is not None]
        steps: list[tuple[Event, str]] = []
        held_models: list[str] = []
        for e in events:
            if e.kind is Kind.STEP:
                touches = esc.step_touches(fn, e)
                shared = [t.name for t in touches if sharing.is_shared(t)]
                if shared:
                    steps.append((e, shared[0]))
                    # the models the optimizer holds name what a backward races on
                    held_models.extend(t.name for t in touches[1:] if sharing.is_shared(t))
        if not forwards and not steps:
            return
        label = f"`{(forwards[0][1] if forwards else (held_models or [steps[0][1]])[0])}`"
        step_names = {id(e): name for e, name in steps}
        found: list[tuple[ast.AST, str, str]] = [
            (call, "forward", f"`{name}`") for call, name in forwards if not esc.under_lock(call)
        ]
        for e in events:
            if e.kind is Kind.STEP and id(e) not in step_names:
                continue
            if esc.under_lock(e.node) or any(esc.under_lock(c) for c in e.chain):
                continue
            if e.kind is Kind.BACKWARD:
                found.append((model.steps.anchor(e), "`backward()`", label))
            else:
                found.append((model.steps.anchor(e), "optimizer step", f"`{step_names[id(e)]}`"))
        yield from sorted(found, key=lambda f: (getattr(f[0], "lineno", 0),
                                                getattr(f[0], "col_offset", 0)))


class _Sharing:
    """Which objects, named in a thread function's terms, every thread shares."""

    def __init__(self, esc: Escapes, fn: FunctionNode, ds: list[Dispatch]) -> None:
        self.esc = esc
        self.fn = fn
        self.params = set(params_of(fn))
        self.shared_params: set[str] = set()
        self.model_params: set[str] = set()
        for p in self.params:
            args = [d.arg(p) for d in ds]
            if any(a is None for a in args):
                continue
            exprs = [a for a in args if a is not None]
            if len({dotted(a) for a in exprs}) == 1 and all(esc.same_object(a) for a in exprs):
                self.shared_params.add(p)
                obj = esc.sent_object(exprs[0], through_put=False)
                if obj is not None and esc.roles.role(obj) is Role.MODEL:
                    self.model_params.add(p)
        receivers = [d.receiver for d in ds]
        self.self_shared = all(r is not None for r in receivers) and len(
            {dotted(r) for r in receivers if r is not None}
        ) == 1 and all(esc.same_object(r) for r in receivers if r is not None)
        self.trained = esc.trained(fn)

    def is_shared(self, touch: Touch) -> bool:
        root = touch.root
        if root in ("self", "cls"):
            return self.self_shared
        if root in self.params:
            return root in self.shared_params
        # a module global or closure variable is one object for every thread
        return not self.esc._local_to(touch.node, self.fn)

    def forwarded(self, call: ast.Call) -> str | None:
        """The shared model ``call`` runs forward (``model(x)``, ``self.net.forward(x)``)
        with autograd recording, or None."""
        func = call.func
        target = func.value if isinstance(func, ast.Attribute) and func.attr == "forward" else func
        if not isinstance(target, (ast.Name, ast.Attribute)):
            return None
        name = dotted(target)
        if name is None or not self.is_shared(Touch(name, target)):
            return None
        # `model(x)` itself, not `model.parameters()` or `model.train()`
        is_model = self.esc.roles.role(target) is Role.MODEL or name in self.trained or (
            name in self.model_params
        )
        if not is_model or self.esc.roles.role(target) is Role.OPTIMIZER:
            return None
        if not grad_enabled_at(self.esc.model, call)[0]:
            return None  # inference under no_grad/inference_mode writes nothing
        return name


class SamplerWithoutSetEpoch(Rule):
    """## What it does
    Flags a `DistributedSampler` whose data is iterated in an epoch loop (through the
    `DataLoader` it is passed to as `sampler=`, or directly) when `set_epoch` is never
    called on it, nor on `loader.sampler`, anywhere in the file. Samplers built with
    `shuffle=False` are not reported.

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
        "sees the same order"
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
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        samplers = model.calls_to(DISTRIBUTED_SAMPLER)
        if not samplers:
            return
        esc = escapes(model)
        keys = {id(s): self._keys(model, s) for s in samplers}
        holders = self._holders(model, samplers, keys)
        for sampler in samplers:
            if is_false(keyword(sampler, "shuffle")):
                continue
            seed = keyword(sampler, "seed")
            if seed is not None and not isinstance(seed, ast.Constant):
                continue  # a seed that changes (`seed=epoch`) reshuffles by itself
            s_keys = keys[id(sampler)]
            loaders = [h for h, s in holders if s is sampler]
            l_keys = {k for h in loaders for k in self._keys(model, h)}
            if self._handed_to_framework(model, loaders, l_keys):
                continue
            if self._epoch_set(model, sampler, s_keys, l_keys, holders):
                continue
            if self._iterated_per_epoch(model, esc, [sampler, *loaders], s_keys | l_keys):
                yield self.report(sampler)

    @staticmethod
    def _keys(model: FileModel, call: ast.Call) -> set[Key]:
        """Role keys of the names bound to the object ``call`` builds, including
        ``sampler = DistributedSampler(ds) if distributed else None``."""
        out: set[Key] = set()
        for key, bindings in model.roles.bindings.items():
            if any(b.call is call for b in bindings):
                out.add(key)
        node: ast.AST = call
        parent = model.parent_of(node)
        while isinstance(parent, (ast.IfExp, ast.BoolOp)) and node is not getattr(
            parent, "test", None
        ):
            node, parent = parent, model.parent_of(parent)
        targets: list[ast.expr] = []
        if isinstance(parent, ast.Assign) and parent.value is node:
            targets = parent.targets
        elif isinstance(parent, (ast.AnnAssign, ast.NamedExpr)) and parent.value is node:
            targets = [parent.target]
        for target in targets:
            if isinstance(target, (ast.Name, ast.Attribute)):
                bound = model.roles.key(target)
                if bound is not None:
                    out.add(bound)
        return out

    @classmethod
    def _holders(cls, model: FileModel, samplers: list[ast.Call],
                 keys: dict[int, set[Key]]) -> list[tuple[ast.Call, ast.Call]]:
        """(loader construction, sampler) for every `sampler=` that passes one of them."""
        out = []
        candidates = [*model.calls_to(DATA_LOADER), *(
            c for name, calls in model.calls.items() if "Loader" in name for c in calls
        )]
        for call in {id(c): c for c in candidates}.values():
            value = keyword(call, "sampler")
            if value is None:
                continue
            for sampler in samplers:
                if cls._refers(model, value, keys[id(sampler)], [sampler]):
                    out.append((call, sampler))
        return out

    @staticmethod
    def _refers(model: FileModel, expr: ast.AST, keys: set[Key], calls: list[ast.Call]) -> bool:
        if any(expr is c for c in calls):
            return True
        if isinstance(expr, (ast.Name, ast.Attribute)):
            return model.roles.key(expr) in keys
        return False

    def _handed_to_framework(self, model: FileModel, loaders: list[ast.Call],
                             l_keys: set[Key]) -> bool:
        for method in _PREPARE_METHODS:
            for call in model.calls.get(method, ()):
                if any(self._refers(model, a, l_keys, loaders) for a in call.args):
                    return True
        return False

    def _epoch_set(self, model: FileModel, sampler: ast.Call, s_keys: set[Key],
                   l_keys: set[Key], holders: list[tuple[ast.Call, ast.Call]]) -> bool:
        """Is `set_epoch` called on this sampler, on its loader (`loader.sampler`), or on
        something this file cannot tell apart from them?"""
        for call in model.calls.get("set_epoch", ()):
            func = call.func
            if not isinstance(func, ast.Attribute):
                return True
            recv = func.value
            if self._refers(model, recv, s_keys | l_keys, [sampler]):
                return True
            if isinstance(recv, ast.Attribute) and recv.attr in ("sampler", "batch_sampler"):
                if self._refers(model, recv.value, l_keys, []):
                    return True
                other = model.roles.lookup(recv.value)
                if other is not None and other.role is Role.LOADER and any(
                    other.call is h for h, s in holders if s is not sampler
                ):
                    continue  # another loader's sampler
                return True
            other = model.roles.lookup(recv)
            if other is not None and other.role is Role.SAMPLER and other.call is not sampler:
                continue  # another sampler
            return True
        return False

    def _iterated_per_epoch(self, model: FileModel, esc: Escapes, calls: list[ast.Call],
                            keys: set[Key]) -> bool:
        """A training loop over the sampler or its loader that itself runs in a loop."""
        steps = model.steps
        training = steps.step_loop_ids | {id(e) for e in steps.epoch_loops}
        for loop in model.loops:
            if not isinstance(loop, (ast.For, ast.AsyncFor)) or id(loop) not in training:
                continue
            refs = [n for n in ast.walk(loop.iter) if isinstance(n, (ast.Name, ast.Attribute,
                                                                    ast.Call))]
            if any(self._refers(model, n, keys, calls) for n in refs):
                if model.loop_contexts(loop):
                    return True
                continue
            # `def train_one_epoch(model, loader, ...)`: the loader arrives as a parameter
            fn = model.function_of(loop)
            if fn is None:
                continue
            params = set(params_of(fn))
            for n in refs:
                if not (isinstance(n, ast.Name) and n.id in params):
                    continue
                for site in model.call_sites.get(id(fn), ()):
                    arg = esc._argument_for(site, fn, n.id)
                    if arg is not None and self._refers(model, arg, keys, calls) and (
                        model.enclosing_loops(loop) or model.loop_contexts(site)
                    ):
                        return True
        return False


RULES = [ModuleSentToRemote, ModuleSentToProcess, UnlockedSharedModel, SamplerWithoutSetEpoch]
