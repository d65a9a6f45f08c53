"""The weight snapshot of a small float32 CPU model: every parameter copied into its own
rows of one kept buffer, its largest |change| the max of its rows' maxima."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainlint._runtime import snapshot
from trainlint._runtime.snapshot import Snapshot


def _params() -> list[nn.Parameter]:
    torch.manual_seed(0)
    shapes = [(40, 30), (30,), (2048,), (3, 5, 7), (1,)]
    return [nn.Parameter(torch.randn(*s)) for s in shapes]


def test_small_float32_parameters_take_rows_and_each_change_is_exact():
    params = _params()
    for round_ in range(3):  # the rows are kept and reused: padding stays zero
        before = [p.detach().clone() for p in params]
        snap = Snapshot(params)
        assert snap._rows is not None
        with torch.no_grad():
            params[0][39, 29] += 0.5 + round_  # the last element of a padded row
            params[2][1500] -= 0.25  # second row of a two-row parameter
            params[3].mul_(1.5)
        changes = snap.changes()
        expected = [
            float((p.detach() - b).abs().max()) for p, b in zip(params, before, strict=True)
        ]
        assert changes == expected
        assert changes[1] == 0.0 and changes[4] == 0.0


def test_rows_report_nan_and_inf_where_they_are_and_only_there():
    params = _params()
    snap = Snapshot(params)
    with torch.no_grad():
        params[2][1100] = math.nan  # in the second row
        params[3][0, 0, 0] = math.inf
        params[4][0] += 3.0
    changes = snap.changes()
    assert math.isnan(changes[2])
    assert changes[3] == math.inf
    assert changes[4] == pytest.approx(3.0)
    assert changes[0] == 0.0 and changes[1] == 0.0


def test_two_snapshots_at_once_do_not_share_rows_and_rebinding_is_seen():
    params = _params()
    first, second = Snapshot(params), Snapshot(params)
    assert first._rows is not None and second._rows is not None
    assert first._rows is not second._rows
    params[1].data = params[1].data + 2.0  # `.data =` rebinds: read at changes()
    assert first.changes()[1] == pytest.approx(2.0)
    with torch.no_grad():
        params[1].sub_(2.0)
    assert second.changes()[1] == pytest.approx(0.0, abs=1e-6)


def test_other_parameters_copy_as_before():
    big = nn.Parameter(torch.zeros(600, 1024))  # past the rows' size
    half = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    empty = nn.Parameter(torch.zeros(0))
    for params in ([big], [half], [empty, nn.Parameter(torch.zeros(3))]):
        snap = Snapshot(params)
        assert snap._rows is None
        with torch.no_grad():
            params[-1].view(-1)[0] += 1.0
        assert snap.changes()[-1] == 1.0
    assert snapshot.take_rows([big]) is None  # remembered as too large


@pytest.mark.parametrize("grad_mode", [True, False])
def test_rows_copy_and_compare_without_autograd_and_leave_its_mode_as_it_was(grad_mode):
    params = _params()
    with torch.set_grad_enabled(grad_mode):
        snap = Snapshot(params)
        assert snap._rows is not None
        rows = snap._rows
        assert torch.is_grad_enabled() is grad_mode
        assert not rows.buffer.requires_grad and rows.buffer.grad_fn is None
        assert all(not v.requires_grad for v in rows.views)
        with torch.no_grad():
            params[1].add_(2.0)
        changes = snap.changes()
        assert torch.is_grad_enabled() is grad_mode
    assert changes[1] == pytest.approx(2.0) and changes[0] == 0.0
    assert not rows.buffer.requires_grad


def test_rows_restore_the_grad_mode_when_the_comparison_raises(monkeypatch):
    params = _params()
    snap = Snapshot(params)
    assert snap._rows is not None

    def broken(*args: object) -> None:
        assert not torch.is_grad_enabled()  # the comparison runs without autograd
        raise ValueError("boom")

    monkeypatch.setattr(torch, "_foreach_sub_", broken)
    with pytest.raises(ValueError, match="boom"):
        snap.changes()
    assert torch.is_grad_enabled()
