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
from trainlint.source import Source


def _source(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


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
        (Via.REMOTE, "f", "m1"),
        (Via.REMOTE, "f", "m2"),
        (Via.REMOTE, "g", "m3"),
        (Via.REMOTE, "g", "m4"),
        (Via.ACTOR, "A", "m5"),
        (Via.ACTOR_METHOD, "fit", "m6"),
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


def test_lambda_targets_bind_the_call_they_make():
    m = _model("""
        import threading
        import torch

        def train(model, opt, shard):
            opt.step()

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        a = threading.Thread(target=lambda: train(model, opt, shard_a))
        b = threading.Thread(target=lambda s=shard_b: train(model, opt, s))
    """)
    (d,) = escapes(m).thread_dispatches  # a lambda with parameters is left unresolved
    assert d.target is not None and d.target.name == "train"
    assert [(p, ast.unparse(e)) for p, e in d.args] == [
        ("model", "model"),
        ("opt", "opt"),
        ("shard", "shard_a"),
    ]


@pytest.mark.parametrize(
    ("loop", "expected"),
    [
        ("for s in shards:", [7, 8, 9]),
        # each thread gets a pair of its own: nothing shared
        ("for model, opt, s in zip(models, optimizers, shards):", []),
    ],
)
def test_threads_started_through_lambdas_share_what_the_lambda_passes(loop, expected):
    from trainlint import lint_source

    source = _source(f"""
        import threading
        import torch

        def train(model, opt, shard):
            for x in shard:
                opt.zero_grad()
                loss = model(x).sum()
                loss.backward()
                opt.step()

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        {loop}
            threading.Thread(target=lambda: train(model, opt, s)).start()
    """)
    found = [f.line for f in lint_source(source, select=["TL503"])]
    assert found == expected


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
