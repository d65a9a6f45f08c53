"""The fast paths of the runtime checks (issue 19) give what the general ones give, to the
bit: the gradient and weight maxima from one aminmax each, the clip read's norm taken from
clip_grad_norm_'s own result, and the hooks and patches are gone however the check ends."""

from __future__ import annotations

import math

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

from trainlint._runtime.magnitudes import as_numbers, cpu_max_abs, max_abs, to_floats
from trainlint._runtime.recorder import GradRecorder, HookSet
from trainlint.testing import (
    CheckFailed,
    assert_clip_effective,
    assert_finite_grads,
    assert_grads_nonzero,
    assert_weights_updated,
)
from trainlint.testing.clip import _total_norm


def _tensors() -> list[torch.Tensor]:
    torch.manual_seed(0)
    ts = [torch.randn(5, 3), torch.randn(7), -torch.rand(4) - 1, torch.zeros(3)]
    ts += [-torch.zeros(2), torch.tensor([1.0, math.inf]), torch.tensor([-math.inf, 0.0])]
    ts += [torch.tensor([math.nan, 1.0]), torch.randn(3, dtype=torch.float64)]
    ts += [torch.randn(6).half(), torch.randn(6).bfloat16()]
    return ts


def _same(a: list[float], b: list[float]) -> bool:
    return all(
        (x != x and y != y) or (x == y and str(x) == str(y)) for x, y in zip(a, b, strict=True)
    )


def test_one_aminmax_gives_the_foreach_maxima_to_the_bit():
    # (what the recorder's CPU hook measures each gradient with)
    ts = _tensors()
    fast = [cpu_max_abs(t) for t in ts]
    slow = to_floats(max_abs(ts))
    assert _same(fast, slow), (fast, slow)
    assert str(fast[4]) == "0.0"  # max |-0.0| is 0.0, as abs() gives it


def test_as_numbers_reads_mixed_floats_and_tensors_in_order():
    ts = _tensors()
    mixed = [*map(cpu_max_abs, ts[:5]), *max_abs(ts[5:])]
    assert _same(as_numbers(mixed), to_floats(max_abs(ts)))


def test_a_sparse_gradient_falls_back_from_the_aminmax_path():
    ts = [torch.randn(3), torch.tensor([0.0, -4.0, 1.0]).to_sparse()]
    assert [cpu_max_abs(t) for t in ts] == to_floats(max_abs(ts))


def test_grads_result_matches_the_gradients_backward_made():
    model = mlp()
    x, y = batch()
    seen: dict[str, float] = {}

    def step() -> None:
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        seen.update({n: float(p.grad.abs().max()) for n, p in model.named_parameters()})

    result = assert_grads_nonzero(model, step)
    assert {n: v[0] for n, v in result.max_abs.items()} == seen


def test_the_recorder_measures_with_the_general_path_when_not_all_on_the_fast_one():
    a = nn.Parameter(torch.randn(3))
    b = nn.Parameter(torch.randn(4, dtype=torch.float64))
    for params, fast in (([a], True), ([a, b], True)):
        with GradRecorder(params) as recorder:
            recorder.begin_step(0)
            sum((p.double() ** 2).sum() for p in params).backward()
            recorder.end_step()
        assert recorder._on_cpu is fast
        assert recorder.table(1)[0] == [float(p.grad.abs().max()) for p in params]
        for p in params:
            p.grad = None


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_the_cpu_hooks_measure_create_graph_and_sparse_gradients_as_the_general_path():
    dense = nn.Parameter(torch.randn(3))
    table = nn.Embedding(5, 2, sparse=True)
    params = [dense, table.weight]
    with GradRecorder(params) as recorder:
        assert recorder._on_cpu
        recorder.begin_step(0)
        loss = (dense**3).sum() + table(torch.tensor([1, 3])).sum() * -2.0
        loss.backward(create_graph=True)  # the dense gradient has history
        recorder.end_step()
    assert dense.grad is not None and dense.grad.requires_grad
    expected = to_floats(max_abs([p.grad.detach() for p in params]))
    assert _same([v for row in recorder.table(1) for v in row], expected)  # type: ignore[arg-type]
    dense.grad = None  # the gradient's history holds the parameter: break the cycle


def test_a_non_finite_gradient_is_read_after_the_step_and_its_rerun_stops_in_backward():
    model = mlp()
    x, y = batch()
    after: list[str] = []

    def step() -> None:
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        (loss * torch.tensor(math.inf)).backward()  # every gradient non-finite
        after.append("went on")

    with pytest.raises(CheckFailed) as info:
        assert_finite_grads(model, step)
    assert after == ["went on"]  # the step ran to its end; the rerun stopped in backward
    result = info.value.result
    # every gradient that backward made was measured before it stopped
    assert all(v[0] is not None and not math.isfinite(v[0]) for v in result.max_abs.values())
    assert "at step 0" in str(info.value)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_the_clip_read_norm_is_the_one_computed_by_hand(norm_type, monkeypatch):
    import trainlint.testing.clip as clip_module

    own: list[int] = []
    monkeypatch.setattr(
        clip_module, "_total_norm", lambda grads: own.append(1) or _total_norm(grads)
    )
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = batch()
    expected: list[float] = []

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        expected.append(float(_total_norm([p.grad.clone() for p in model.parameters()])))
        nn.utils.clip_grad_norm_(model.parameters(), 1e-3, norm_type=norm_type)
        optimizer.step()

    result = assert_clip_effective(model, step, steps=2)
    assert [r.seen for r in result.reads] == expected  # exactly, fast path or not
    assert [r.backward for r in result.reads] == expected
    assert len(own) == (0 if norm_type == 2.0 else 2), "the 2-norm is clip_grad_norm_'s own"


def test_hooks_and_patches_are_gone_when_a_step_raises():
    model = mlp()
    x, y = batch()
    zero_grad, clip = torch.optim.Optimizer.zero_grad, nn.utils.clip_grad_norm_

    def step() -> None:
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        raise KeyError("boom")

    for check in (assert_clip_effective, assert_finite_grads, assert_weights_updated):
        with pytest.raises(KeyError):
            check(model, step)
        assert all(not p._post_accumulate_grad_hooks for p in model.parameters()), check
        assert torch.optim.Optimizer.zero_grad is zero_grad
        assert nn.utils.clip_grad_norm_ is clip


def test_a_hook_set_takes_off_what_it_put_on_and_leaves_others():
    p = nn.Parameter(torch.ones(2))
    q = torch.ones(2, requires_grad=True)
    calls: list[str] = []
    own = p.register_post_accumulate_grad_hook(lambda t: calls.append("user"))
    hooks = HookSet()
    hooks.add(p, lambda t: calls.append("p"))
    hooks.add(q, lambda t: calls.append("q"))
    (p.sum() + q.sum()).backward()
    assert sorted(calls) == ["p", "q", "user"]
    hooks.remove()
    calls.clear()
    (p.sum() + q.sum()).backward()
    assert calls == ["user"]
    own.remove()
    assert not p._post_accumulate_grad_hooks and not q._post_accumulate_grad_hooks


def test_a_failing_grads_check_reports_as_before():
    model = mlp()
    x, _ = batch()

    def step() -> None:
        model.zero_grad()
        (0 * model(x).sum()).backward()  # every gradient is all zero

    with pytest.raises(CheckFailed, match="got no gradient or an all-zero one") as info:
        assert_grads_nonzero(model, step)
    assert all(v == (0.0,) for v in info.value.result.max_abs.values())
    assert "all zero" in str(info.value)


def test_named_parameters_walk_is_the_public_one():
    from trainlint.testing._common import named_parameters

    shared = nn.Linear(3, 3)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.ones(1))
            self.a = nn.Sequential(
                nn.Linear(2, 2), shared, nn.ModuleDict({"x": nn.Linear(1, 1), "y": shared})
            )
            self.b = shared
            self.n = None
            self.register_parameter("q", None)
            self.tied = self.a[0].weight  # a second name for a parameter: listed once
            self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)
            self.empty = nn.Parameter(torch.ones(0))

    class OwnWalk(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

        def named_modules(self, *args, **kwargs):  # type: ignore[override]
            yield from super().named_modules(*args, **kwargs)

    for model in (Model(), nn.Sequential(OwnWalk(), nn.Linear(2, 1)), mlp()):
        expected = list(model.named_parameters())
        got = named_parameters(model)
        assert [n for n, _ in got] == [n for n, _ in expected]
        assert all(a is b for (_, a), (_, b) in zip(got, expected, strict=True))
        kept = [(n, p) for n, p in expected if p.requires_grad and p.numel() > 0]
        got = named_parameters(model, trainable=True)
        assert [n for n, _ in got] == [n for n, _ in kept]
        assert all(a is b for (_, a), (_, b) in zip(got, kept, strict=True))


def test_large_cpu_gradients_are_measured_in_their_hooks_too():
    """A CPU parameter past small_dense's size is measured by its hook's aminmax like the
    small ones (one read pass), not by an engine callback: the same numbers, a NaN kept,
    and max |-0.0| is 0.0."""
    torch.manual_seed(0)
    big = nn.Parameter(torch.randn(300, 300))  # 90,000 elements: not small_dense
    small = nn.Parameter(torch.randn(5))
    grads = [torch.randn(300, 300), -torch.zeros(300, 300), torch.randn(300, 300)]
    grads[2][7, 7] = math.nan
    for grad in grads:
        with GradRecorder([big, small]) as recorder:
            assert recorder._on_cpu
            recorder.begin_step(0)
            ((big * grad).sum() + small.sum()).backward()
            recorder.end_step()
        assert recorder._pending == [] and all(type(v) is float for _, _, v in recorder.events)
        expected = [float(grad.abs().max()), 1.0]
        got = recorder.table(1)[0]
        assert _same(got, expected), (got, expected)  # type: ignore[arg-type]
        assert str(got[0]) != "-0.0"
        big.grad = small.grad = None


def test_the_first_device_and_loss_value_are_the_general_ones():
    from trainlint._runtime.steps import model_device
    from trainlint.testing._common import first_device, loss_value, named_parameters

    model = mlp()
    assert first_device(model, named_parameters(model)) == model_device(model)

    class Reordered(nn.Module):  # parameters() not the base class's: asked, not assumed
        def __init__(self) -> None:
            super().__init__()
            self.body = mlp()

        def parameters(self, recurse: bool = True):
            return iter([torch.zeros(1, device="meta"), *super().parameters(recurse)])

    odd = Reordered()
    assert first_device(odd, named_parameters(odd)) == torch.device("meta")
    w = torch.randn(3, requires_grad=True)
    for out in ((w * 2).sum(), w * 2, torch.tensor(3), torch.tensor([2.5]), (w.sum(), 1)):
        detached = (out[0] if isinstance(out, tuple) else out).detach()
        expected = float(detached if detached.numel() == 1 else detached.float().mean())
        assert loss_value(out) == expected
    assert math.isnan(loss_value(torch.tensor(math.nan)))
    with pytest.raises(RuntimeError):
        loss_value(torch.tensor(1 + 2j))
