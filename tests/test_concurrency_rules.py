"""TL501-TL504 beyond their embedded examples: realistic scripts, the escape analysis
itself, and the runtime behaviour TL502 relies on.

In the scripts below a line that must be reported ends with ``# expect``; every other
line must stay silent.
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from trainlint.analysis.escapes import Via, escapes
from trainlint.analysis.model import FileModel
from trainlint.rule_testing import example_params, lint_example, run_example
from trainlint.rules.concurrency import (
    RULES,
    ModuleSentToProcess,
    ModuleSentToRemote,
    SamplerWithoutSetEpoch,
    UnlockedSharedModel,
)
from trainlint.source import Source


@pytest.mark.parametrize(("rule", "example"), example_params(RULES))
def test_examples(rule, example):
    run_example(rule, example)


def _source(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def _expected(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("# expect")]


SCRIPTS = {
    # -- TL501 --------------------------------------------------------------------------
    "tl501-actor-method-gets-model": (ModuleSentToRemote, """
        import ray, torch

        @ray.remote
        class Worker:
            def fit(self, model, opt, data):
                for x in data:
                    opt.zero_grad()
                    model(x).sum().backward()
                    opt.step()

        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        w = Worker.remote()
        ray.get(w.fit.remote(model, opt, data))  # expect
        evaluate(model)
    """),
    "tl501-helper-steps-param-optimizer": (ModuleSentToRemote, """
        import ray, torch

        def train_epoch(net, optimizer, loader):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()
                optimizer.step()

        @ray.remote
        def run(model, loader, epochs):
            opt = torch.optim.Adam(model.parameters())
            for _ in range(epochs):
                train_epoch(model, opt, loader)

        model = torch.nn.Linear(2, 2)
        ray.get(run.remote(model, loader, 5))  # expect
        evaluate(model)
    """),
    "tl501-self-attributes-sent": (ModuleSentToRemote, """
        import ray, torch

        @ray.remote
        def train(model, opt, loader):
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

        class Driver:
            def __init__(self):
                self.model = torch.nn.Linear(2, 2)
                self.opt = torch.optim.Adam(self.model.parameters())

            def round(self, loader):
                ray.get(train.remote(self.model, self.opt, loader))  # expect
                return self.model.state_dict()
    """),
    "tl501-actor-builds-its-own-model": (ModuleSentToRemote, """
        import ray, torch

        @ray.remote
        class Worker:
            def __init__(self, cfg):
                self.model = build(cfg)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def fit(self, data):
                for x in data:
                    self.opt.zero_grad()
                    self.model(x).sum().backward()
                    self.opt.step()

        model = torch.nn.Linear(2, 2)
        w = Worker.remote(cfg)
        ray.get(w.fit.remote(data))
        evaluate(model)
    """),
    "tl501-teacher-only-read": (ModuleSentToRemote, """
        import ray, torch

        @ray.remote
        def distill(teacher, data):
            student = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(student.parameters(), lr=0.1)
            for x in data:
                with torch.no_grad():
                    t = teacher(x)
                opt.zero_grad()
                ((student(x) - t) ** 2).mean().backward()
                opt.step()
            return student.state_dict()

        teacher = torch.nn.Linear(2, 2)
        sd = ray.get(distill.remote(teacher, data))
        evaluate(teacher)
    """),
    "tl501-remote-imported-from-elsewhere": (ModuleSentToRemote, """
        import ray, torch
        from workers import train

        model = torch.nn.Linear(2, 2)
        ray.get(train.remote(model, loader))
        evaluate(model)
    """),
    "tl501-loaded-back-in-next-round": (ModuleSentToRemote, """
        import ray, torch

        @ray.remote
        def train(model, opt, loader):
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            return model.state_dict()

        model = torch.nn.Linear(2, 2)
        opt = torch.optim.Adam(model.parameters())
        refs = []
        for r in range(5):
            if refs:
                model.load_state_dict(ray.get(refs[-1]))
            refs.append(train.remote(model, opt, loader))
    """),
    "tl501-remote-saves-its-own-checkpoint": (ModuleSentToRemote, """
        import ray, torch

        @ray.remote
        def run(model, opt, loader):
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
            torch.save(model.state_dict(), "out.pt")

        model = torch.nn.Linear(2, 2)
        opt = torch.optim.Adam(model.parameters())
        ray.get(run.remote(model, opt, loader))
    """),
    # -- TL502 --------------------------------------------------------------------------
    "tl502-self-model-to-fork-process": (ModuleSentToProcess, """
        import torch
        from multiprocessing import Process

        def train(model, opt):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        class Runner:
            def __init__(self):
                self.model = torch.nn.Linear(2, 2)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def run(self):
                p = Process(target=train, args=(self.model, self.opt))  # expect
                p.start()
                p.join()
                return self.model.state_dict()
    """),
    "tl502-partial-target": (ModuleSentToProcess, """
        import functools
        import torch
        import torch.multiprocessing as mp

        def train(model, lr, data):
            opt = torch.optim.SGD(model.parameters(), lr=lr)
            for x in data:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

        model = torch.nn.Linear(2, 2)
        p = mp.Process(target=functools.partial(train, model, 0.1), args=(data,))  # expect
        p.start(); p.join()
        evaluate(model)
    """),
    "tl502-spawn-context-worker-moves-to-cuda": (ModuleSentToProcess, """
        import torch
        import torch.multiprocessing as mp

        def train(model):
            model.cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        ctx = mp.get_context("spawn")
        model = torch.nn.Linear(2, 2)
        p = ctx.Process(target=train, args=(model,))  # expect
        p.start(); p.join()
        print(model.weight)
    """),
    "tl502-pool-worker-moves-to-device": (ModuleSentToProcess, """
        import torch
        import torch.multiprocessing as mp

        def train(model, device):
            model = model.to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        model = torch.nn.Linear(2, 2)
        with mp.Pool(2) as pool:
            r = pool.apply_async(train, (model, "cuda:0"))  # expect
            r.get()
        print(model.weight)
    """),
    "tl502-moved-only-after-training": (ModuleSentToProcess, """
        import torch
        import torch.multiprocessing as mp

        def worker(rank, model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            torch.save(model.to("cpu").state_dict(), "w.pt")

        model = torch.nn.Linear(2, 2)
        mp.spawn(worker, args=(model,), nprocs=2)
        print(model.weight)
    """),
    "tl502-start-method-not-a-literal": (ModuleSentToProcess, """
        import torch
        import torch.multiprocessing as mp

        def train(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        mp.set_start_method(args.start_method)
        model = torch.nn.Linear(2, 2)
        p = mp.Process(target=train, args=(model,))
        p.start(); p.join()
        evaluate(model)
    """),
    "tl502-shared-parameter-by-parameter": (ModuleSentToProcess, """
        import torch
        import torch.multiprocessing as mp

        def train(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        model = torch.nn.Linear(2, 2)
        for p in model.parameters():
            p.share_memory_()
        proc = mp.Process(target=train, args=(model,))
        proc.start(); proc.join()
        evaluate(model)
    """),
    # -- TL503 --------------------------------------------------------------------------
    "tl503-executor-map-over-batches": (UnlockedSharedModel, """
        import torch
        from concurrent.futures import ThreadPoolExecutor

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def process_batch(batch):
            x, y = batch
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)  # expect
            loss.backward()  # expect
            optimizer.step()  # expect
            return loss.item()

        with ThreadPoolExecutor(max_workers=4) as ex:
            losses = list(ex.map(process_batch, batches))
    """),
    "tl503-single-worker-executor": (UnlockedSharedModel, """
        import torch
        from concurrent.futures import ThreadPoolExecutor

        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def process_batch(batch):
            optimizer.zero_grad()
            model(batch).sum().backward()
            optimizer.step()

        with ThreadPoolExecutor(max_workers=1) as ex:
            list(ex.map(process_batch, batches))
    """),
    "tl503-acquire-release": (UnlockedSharedModel, """
        import threading, torch
        lock = threading.Lock()
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def worker(batches):
            for b in batches:
                lock.acquire()
                try:
                    optimizer.zero_grad()
                    model(b).sum().backward()
                    optimizer.step()
                finally:
                    lock.release()

        ts = [threading.Thread(target=worker, args=(s,)) for s in shards]
    """),
    "tl503-two-threads-same-model": (UnlockedSharedModel, """
        import threading, torch

        def train(model, data):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in data:
                opt.zero_grad()
                model(x).sum().backward()  # expect
                opt.step()  # expect

        net = torch.nn.Linear(2, 2)
        t1 = threading.Thread(target=train, args=(net, d1))
        t2 = threading.Thread(target=train, args=(net, d2))
        t1.start(); t2.start()
    """),
    "tl503-two-threads-two-models": (UnlockedSharedModel, """
        import threading, torch

        def train(model, data):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in data:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

        a = torch.nn.Linear(2, 2)
        b = torch.nn.Linear(2, 2)
        t1 = threading.Thread(target=train, args=(a, d1))
        t2 = threading.Thread(target=train, args=(b, d2))
        t1.start(); t2.start()
    """),
    "tl503-one-background-thread": (UnlockedSharedModel, """
        import threading, torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def train():
            for x in data:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

        threading.Thread(target=train, daemon=True).start()
    """),
    "tl503-lock-on-self": (UnlockedSharedModel, """
        import threading, torch

        class Trainer:
            def __init__(self):
                self.model = torch.nn.Linear(2, 2)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                self._lock = threading.Lock()

            def work(self, shard):
                for x in shard:
                    with self._lock:
                        self.opt.zero_grad()
                        self.model(x).sum().backward()
                        self.opt.step()

            def fit(self, shards):
                for s in shards:
                    threading.Thread(target=self.work, args=(s,)).start()
    """),
    "tl503-forward-only-threads": (UnlockedSharedModel, """
        import threading, torch
        model = torch.nn.Linear(2, 2)

        def predict(q):
            for x in q:
                print(model(x))

        for q in queues:
            threading.Thread(target=predict, args=(q,)).start()
    """),
    "tl503-one-worker-object-per-thread": (UnlockedSharedModel, """
        import threading, torch

        class Worker:
            def __init__(self):
                self.model = torch.nn.Linear(2, 2)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def run(self):
                self.opt.zero_grad()
                self.model(x).sum().backward()
                self.opt.step()

        for i in range(4):
            w = Worker()
            threading.Thread(target=w.run).start()
    """),
    "tl503-one-worker-object-for-all-threads": (UnlockedSharedModel, """
        import threading, torch

        class Worker:
            def __init__(self):
                self.model = torch.nn.Linear(2, 2)
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

            def run(self):
                self.opt.zero_grad()
                self.model(x).sum().backward()  # expect
                self.opt.step()  # expect

        w = Worker()
        for i in range(4):
            threading.Thread(target=w.run).start()
    """),
    "tl503-closure": (UnlockedSharedModel, """
        import threading, torch

        def fit(shards):
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            def worker(shard):
                for x in shard:
                    opt.zero_grad()
                    model(x).sum().backward()  # expect
                    opt.step()  # expect
            threads = [threading.Thread(target=worker, args=(s,)) for s in shards]
            for t in threads:
                t.start()
    """),
    "tl503-helper-without-lock": (UnlockedSharedModel, """
        import threading, torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            opt.zero_grad()
            model(x).sum().backward()  # expect
            opt.step()  # expect

        def worker(shard):
            for x in shard:
                step(x)

        for s in shards:
            threading.Thread(target=worker, args=(s,)).start()
    """),
    "tl503-helper-called-under-lock": (UnlockedSharedModel, """
        import threading, torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        lock = threading.Lock()

        def step(x):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

        def worker(shard):
            for x in shard:
                with lock:
                    step(x)

        for s in shards:
            threading.Thread(target=worker, args=(s,)).start()
    """),
    "tl503-lock-ends-before-step": (UnlockedSharedModel, """
        import threading, torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        lock = threading.Lock()

        def worker(shard):
            for x in shard:
                with lock:
                    loss = model(x).sum()
                    loss.backward()
                opt.step()  # expect

        for s in shards:
            threading.Thread(target=worker, args=(s,)).start()
    """),
    "tl503-thread-pool-starmap": (UnlockedSharedModel, """
        import torch
        from multiprocessing.pool import ThreadPool

        def fit(model, opt, x):
            opt.zero_grad()
            model(x).sum().backward()  # expect
            opt.step()  # expect

        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with ThreadPool(4) as pool:
            pool.starmap(fit, [(model, opt, x) for x in batches])
    """),
    # -- TL504 --------------------------------------------------------------------------
    "tl504-imagenet-style-conditional-sampler": (SamplerWithoutSetEpoch, """
        import torch
        import torch.utils.data
        import torch.utils.data.distributed

        def train(train_loader, model, criterion, optimizer, epoch, args):
            model.train()
            for i, (images, target) in enumerate(train_loader):
                loss = criterion(model(images), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

        def main_worker(gpu, args):
            model = build()
            criterion = torch.nn.CrossEntropyLoss()
            optimizer = torch.optim.SGD(model.parameters(), args.lr)
            if args.distributed:
                train_sampler = torch.utils.data.distributed.DistributedSampler(ds)  # expect
            else:
                train_sampler = None
            train_loader = torch.utils.data.DataLoader(
                ds, batch_size=args.batch_size, shuffle=(train_sampler is None),
                sampler=train_sampler)
            for epoch in range(args.start_epoch, args.epochs):
                train(train_loader, model, criterion, optimizer, epoch, args)
    """),
    "tl504-imagenet-style-with-set-epoch": (SamplerWithoutSetEpoch, """
        import torch
        import torch.utils.data
        import torch.utils.data.distributed

        def train(train_loader, model, criterion, optimizer):
            for images, target in train_loader:
                optimizer.zero_grad()
                criterion(model(images), target).backward()
                optimizer.step()

        def main_worker(gpu, args):
            optimizer = torch.optim.SGD(model.parameters(), args.lr)
            train_sampler = torch.utils.data.distributed.DistributedSampler(ds)
            train_loader = torch.utils.data.DataLoader(ds, sampler=train_sampler)
            for epoch in range(args.epochs):
                if args.distributed:
                    train_sampler.set_epoch(epoch)
                train(train_loader, model, criterion, optimizer)
    """),
    "tl504-conditional-expression": (SamplerWithoutSetEpoch, """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler

        sampler = DistributedSampler(ds) if distributed else None  # expect
        loader = DataLoader(ds, sampler=sampler, shuffle=sampler is None)
        for epoch in range(10):
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """),
    "tl504-trainer-attributes": (SamplerWithoutSetEpoch, """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler

        class Trainer:
            def __init__(self, ds, model):
                self.model = model
                self.opt = torch.optim.AdamW(model.parameters())
                self.sampler = DistributedSampler(ds)  # expect
                self.loader = DataLoader(ds, batch_size=8, sampler=self.sampler)

            def train_epoch(self):
                for x in self.loader:
                    self.opt.zero_grad()
                    self.model(x).sum().backward()
                    self.opt.step()

            def fit(self, epochs):
                for epoch in range(epochs):
                    self.train_epoch()
    """),
    "tl504-unknown-set-epoch-receiver": (SamplerWithoutSetEpoch, """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler

        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(10):
            ds.set_epoch(epoch)
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """),
    "tl504-evaluation-only": (SamplerWithoutSetEpoch, """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler

        val_loader = DataLoader(ds, sampler=DistributedSampler(ds))
        for epoch in range(10):
            with torch.no_grad():
                for x in val_loader:
                    print(model(x))
    """),
    "tl504-seed-changes-every-epoch": (SamplerWithoutSetEpoch, """
        import torch
        from torch.utils.data import DataLoader, DistributedSampler
        for epoch in range(10):
            loader = DataLoader(ds, sampler=DistributedSampler(ds, seed=epoch))
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """),
    "tl504-while-loop-and-tqdm": (SamplerWithoutSetEpoch, """
        import torch
        from tqdm import tqdm
        from torch.utils.data import DataLoader, DistributedSampler
        sampler = DistributedSampler(ds)  # expect
        loader = DataLoader(ds, sampler=sampler)
        while step < max_steps:
            for i, x in enumerate(tqdm(loader)):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                step += 1
    """),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script(name):
    rule, text = SCRIPTS[name]
    source = _source(text)
    findings = lint_example(rule, source, dedent=False)
    got = sorted(f.line for f in findings)
    assert got == _expected(source), [f"{f.line}: {f.message}" for f in findings]


# -- the escape analysis ---------------------------------------------------------------------


def _model(text: str) -> FileModel:
    source = _source(text)
    return FileModel(ast.parse(source), Source(source))


def test_dispatch_kinds_start_methods_and_arguments():
    m = _model("""
        import multiprocessing as mp
        import torch.multiprocessing as tmp
        from concurrent.futures import ThreadPoolExecutor
        import threading

        def train(model, data):
            pass

        def worker(rank, model):
            pass

        ctx = mp.get_context("forkserver")
        ctx.Process(target=train, args=(net, d))
        mp.Process(target=train, kwargs={"model": net, "data": d})
        tmp.spawn(worker, args=(net,), nprocs=2)
        with mp.Pool(2) as pool:
            pool.starmap(train, [(net, d)] * 2)
        for s in shards:
            t = threading.Thread(target=train, args=(net, s))
            t.start()
            t.join()
        with ThreadPoolExecutor(1) as ex:
            ex.submit(train, net, d)
    """)
    esc = escapes(m)
    procs = esc.process_dispatches
    assert [d.via for d in procs] == [Via.PROCESS, Via.PROCESS, Via.SPAWN, Via.POOL]
    # the file selects forkserver once, so a plain Process counts as not forking (SPEC)
    assert [d.start_method for d in procs[:3]] == ["forkserver", "spawn", "spawn"]
    for d in procs:
        assert dict(d.args)["model"].id == "net"  # type: ignore[attr-defined]
    threads = esc.thread_dispatches
    assert [d.via for d in threads] == [Via.THREAD, Via.THREAD_POOL]
    assert all(d.serial for d in threads)  # joined in the loop; a single-worker pool
    assert threads[0].repeated and not threads[1].repeated


def test_remote_forms_resolve_to_their_definitions():
    m = _model("""
        import ray
        from ray import remote as rr

        @rr(num_gpus=1)
        def f(model):
            pass

        def g(model):
            pass

        @ray.remote
        class A:
            def __init__(self, model):
                pass

            def fit(self, model):
                pass

        wrapped = ray.remote(g)
        f.remote(m1)
        f.options(num_gpus=2).remote(m2)
        wrapped.remote(m3)
        ray.remote(g).remote(m4)
        h = A.remote(m5)
        h.fit.remote(m6)
    """)
    found = [(d.via, d.name, dict(d.args)["model"].id) for d in escapes(m).remote_dispatches]
    assert found == [
        (Via.REMOTE, "f", "m1"), (Via.REMOTE, "f", "m2"), (Via.REMOTE, "g", "m3"),
        (Via.REMOTE, "g", "m4"), (Via.ACTOR, "A", "m5"), (Via.ACTOR_METHOD, "fit", "m6"),
    ]


def test_trained_names_follow_helpers_aliases_and_self():
    m = _model("""
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        def inner(optimizer, batch):
            optimizer.zero_grad()
            batch.backward()
            optimizer.step()

        def outer(model, other, rank):
            ddp = DDP(model.to(rank))
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            inner(opt, other)

        class Actor:
            def __init__(self, model, optimizer, cfg):
                self.model = model
                self.opt = optimizer

            def step(self):
                self.opt.step()
    """)
    esc = escapes(m)
    fns = {fn.name: fn for fn in m.functions}
    assert set(esc.trained(fns["outer"])) == {"opt", "model"}
    assert set(esc.trained(fns["inner"])) == {"optimizer"}
    assert esc.actor_trained(m.classes[0]) == {"optimizer"}


# -- the runtime behaviour TL502 is built on -------------------------------------------------


def _train(model):  # pragma: no cover - runs in a child process
    import torch

    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(1, 4)).sum().backward()
        opt.step()
    return 0


@pytest.mark.slow
def test_fork_process_trains_a_copy_but_a_pool_shares_tensors():
    """Why TL502 reports a fork `Process` and stays silent on pools: a fork child gets a
    copy-on-write copy, while pool arguments go through torch's pickler, which moves
    their tensors into shared memory (so the parent sees the training)."""
    torch = pytest.importorskip("torch")
    mp = torch.multiprocessing
    if "fork" not in mp.get_all_start_methods():
        pytest.skip("no fork start method on this platform")
    ctx = mp.get_context("fork")

    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    p = ctx.Process(target=_train, args=(model,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    assert torch.equal(model.weight.detach(), before), "fork child trained the parent's copy"

    with ctx.Pool(1) as pool:
        pool.map(_train, [model])
    assert not torch.equal(model.weight.detach(), before), "pool did not share the tensors"
