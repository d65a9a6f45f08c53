"""assert_no_graph_in_eval on real evaluation loops: it sees TL303, and confirms it."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from runtime_helpers import batch, mlp
from torch import nn

from trainlint.testing import CheckFailed, EvalGraphResult, assert_no_graph_in_eval


def evaluation(model: nn.Module, batches, *, guard=None):
    """An evaluation loop over ``batches``: accuracy-style sums, the outputs kept."""

    def evaluate():
        model.eval()
        outputs = []
        total = 0.0
        for x, y in batches:
            if guard is None:
                out = model(x)
            else:
                with guard():
                    out = model(x)
            total += ((out - y) ** 2).mean().item()
            outputs.append(out)
        model.train()
        return total, outputs

    return evaluate


def loader(n=3):
    return [batch(seed=i, n=16) for i in range(n)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("guard", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inf"])
def test_an_evaluation_under_no_grad_passes(seed, guard):
    model = mlp(seed)
    result = assert_no_graph_in_eval(model, evaluation(model, loader(), guard=guard))
    assert isinstance(result, EvalGraphResult)
    assert result.saved_tensors == (0, 0)
    assert result.saved_bytes == (0, 0)
    assert result.with_history == ()
    assert not result.built_graph


def test_a_decorated_evaluation_function_passes():
    model = mlp()
    batches = loader()

    @torch.no_grad()
    def evaluate():
        return [model(x) for x, _ in batches]

    assert assert_no_graph_in_eval(model, evaluate, steps=3).saved_tensors == (0, 0, 0)


def test_a_frozen_model_builds_no_graph():
    model = mlp().requires_grad_(False)
    assert not assert_no_graph_in_eval(model, evaluation(model, loader())).built_graph


def test_an_evaluation_outside_no_grad_fails_naming_tl303():
    model = mlp()
    with pytest.raises(CheckFailed) as info:
        assert_no_graph_in_eval(model, evaluation(model, loader()))
    failure = info.value
    assert failure.check == "assert_no_graph_in_eval"
    assert failure.rules == ("TL303",)
    result = failure.result
    # per batch, Linear(8,16) saves its input, ReLU its output, Linear(16,1) its input
    assert all(n > 0 for n in result.saved_tensors)
    assert result.saved_tensors[0] == result.saved_tensors[1]
    assert result.saved_bytes[0] > 0
    assert "step 0 returned[1][0] (AddmmBackward0)" in result.with_history
    message = str(failure)
    assert message.startswith("assert_no_graph_in_eval: the evaluation step built an autograd")
    assert "TL303 eval-without-no-grad" in message
    assert "torch.no_grad()" in message


def test_history_kept_on_the_model_is_found_even_when_nothing_is_returned():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = mlp()
            self.last = None

        def forward(self, x):
            self.last = self.body(x)
            return self.last

    model = Net()
    x, _ = batch()

    def evaluate():
        model(x).argmax(0)  # nothing returned

    with pytest.raises(CheckFailed) as info:
        assert_no_graph_in_eval(model, evaluate)
    assert "model.last (AddmmBackward0)" in info.value.result.with_history


def test_history_the_model_kept_from_training_is_not_the_evaluations():
    model = mlp()
    x, y = batch()
    model.last_loss = nn.functional.mse_loss(model(x), y)  # kept by a training step before

    @torch.no_grad()
    def evaluate():
        return model(x)

    assert not assert_no_graph_in_eval(model, evaluate).built_graph


def test_batches_are_passed_to_the_step():
    model = mlp()
    seen = []

    def evaluate(b):
        seen.append(b)
        with torch.no_grad():
            model(b[0])

    batches = loader(2)
    assert_no_graph_in_eval(model, evaluate, steps=3, batches=batches)
    assert [b[0] for b in seen] == [batches[0][0], batches[1][0], batches[0][0]]


def test_the_failure_lints_the_evaluation_function(tmp_path, monkeypatch):
    source = tmp_path / "evaluating.py"
    source.write_text(
        textwrap.dedent(
            """
            import torch


            def evaluate(model, loader):
                model.eval()
                correct = 0
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).sum().item()
                return correct
            """
        ).lstrip(),
        encoding="utf-8",
    )
    # TL303 is opt-in: the project selects it, as the lint block reads the project's config
    (tmp_path / "pyproject.toml").write_text("[tool.trainlint]\nextend-select = ['TL303']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import evaluating

    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    batches = [(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))]
    with pytest.raises(CheckFailed) as info:
        assert_no_graph_in_eval(model, lambda: evaluating.evaluate(model, batches))
    lint_block = str(info.value).split("on the step's lines")[1]
    assert "evaluating.py:8:" in lint_block and "TL303" in lint_block


def test_tl303_is_confirmed_by_a_failing_eval_check(pytester):
    pytester.makepyprojecttoml("[tool.trainlint]\nextend-select = ['TL303']\n")
    pytester.makepyfile(
        evaluating="""
        import torch


        def evaluate(model, loader):
            model.eval()
            correct = 0
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
            return correct
        """,
        test_eval="""
        import torch
        from torch import nn

        import evaluating


        def test_eval_builds_no_graph(assert_no_graph_in_eval):
            model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
            batches = [(torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))]
            assert_no_graph_in_eval(model, lambda: evaluating.evaluate(model, batches))
        """,
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--trainlint", "--trainlint-report=out.json"
    )
    result.assert_outcomes(failed=1)
    report = json.loads((pytester.path / "out.json").read_text("utf-8"))
    tl303 = [f for f in report["findings"] if f["code"] == "TL303"]
    assert [f["status"] for f in tl303] == ["confirmed"]
    assert tl303[0]["confirmed_by"] == ["test_eval.py::test_eval_builds_no_graph"]
