"""TL503 unlocked-shared-model."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from trainlint.analysis.escapes import Dispatch
from trainlint.analysis.model import FileModel
from trainlint.analysis.objects import objects
from trainlint.rules.base import Invalid, Report, Rule


class UnlockedSharedModel(Rule):
    """## What it does
    Flags a forward, `backward()` or optimizer step in a function that runs on several
    threads at once (`threading.Thread(target=f)` or `target=lambda: f(...)` in a loop or
    more than once, in a function or a script, unless each is joined before the next is
    made; `submit/map` of a `ThreadPoolExecutor`/`ThreadPool`; the `run()` of a Thread
    subclass, directly or through a project base class, built several times here or in
    another module) on a model or optimizer all those threads share (a module global, a
    closure variable, a `self` attribute of one object, the same object passed to each
    thread or constructor, a parameter known as a model by its annotation or from every
    call site), when the call is not inside `with lock:` on a `threading.Lock`/`RLock`.

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
        # a Thread subclass: each instance gets a model of its own
        """
import threading
import torch

class Worker(threading.Thread):
    def __init__(self, model, shard):
        super().__init__()
        self.model, self.shard = model, shard
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run(self):
        for x in self.shard:
            self.opt.zero_grad()
            self.model(x).sum().backward()
            self.opt.step()

for s in shards:
    Worker(torch.nn.Linear(4, 1), s).start()
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
        # a script's two threads, the first joined before the second is created
        """
import threading
import torch
def train(model, opt, shard):
    for x in shard:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
first = threading.Thread(target=train, args=(model, opt, shard_a))
first.start()
first.join()
second = threading.Thread(target=train, args=(model, opt, shard_b))
second.start()
second.join()
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
        # a Thread subclass given the same model and optimizer by every constructor call
        Invalid(
            """
import threading
import torch

class Worker(threading.Thread):
    def __init__(self, model, opt, shard):
        super().__init__()
        self.model, self.opt, self.shard = model, opt, shard

    def run(self):
        for x in self.shard:
            self.opt.zero_grad()
            self.model(x).sum().backward()
            self.opt.step()

def main(shards):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for t in [Worker(model, opt, s) for s in shards]:
        t.start()
""",
            lines=(12, 13),
        ),
        # a script that starts two threads on the same module-level model and optimizer
        Invalid(
            """
import threading
import torch
def train(model, opt, shard):
    for x in shard:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
t1 = threading.Thread(target=train, args=(model, opt, shard_a))
t2 = threading.Thread(target=train, args=(model, opt, shard_b))
t1.start()
t2.start()
""",
            lines=(6, 7),
        ),
        # parameters annotated as a model and an optimizer, handed to every thread
        Invalid(
            """
import threading
from torch import nn, optim
def worker(net, opt, shard):
    for x in shard:
        opt.zero_grad()
        loss = net(x).sum()
        loss.backward()
        opt.step()
def train_parallel(net: nn.Module, opt: optim.Optimizer, shards):
    for s in shards:
        threading.Thread(target=worker, args=(net, opt, s)).start()
""",
            lines=(6, 7, 8),
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        esc = objects(model).escape_analysis
        groups: dict[int, list[Dispatch]] = defaultdict(list)
        for d in esc.thread_dispatches:
            if d.target is not None and not d.serial:
                groups[id(d.target)].append(d)
        seen: set[int] = set()
        for ds in groups.values():
            fn = ds[0].target
            if fn is None or (len(ds) < 2 and not ds[0].repeated) or esc.one_at_a_time(ds):
                continue
            for node, what, shared in esc.unlocked_training(fn, ds):
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
