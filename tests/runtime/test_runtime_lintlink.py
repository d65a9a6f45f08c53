"""A failing check lints the step's source and prints the findings on the step's lines."""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass

import pytest
import torch
from runtime_helpers import accumulating_trainer_module, batch, mlp
from torch import nn

import trainlint
from trainlint._runtime.lintlink import findings_section, source_spans
from trainlint.testing import CheckFailed, assert_memory_stable


@dataclass
class FakeFinding:
    code: str
    name: str
    path: str
    line: int
    column: int
    message: str


def leaky_training(model, optimizer, x, y, history):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    history.append(loss)  # the leak
    return loss


LEAK_LINE = inspect.getsourcelines(leaky_training)[1] + 5


def make_step():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    history: list[torch.Tensor] = []
    return lambda: leaky_training(model, opt, x, y, history)


@pytest.fixture
def fake_linter(monkeypatch):
    calls = []
    here = os.path.realpath(__file__)

    def lint_paths(paths, **kwargs):
        calls.append([os.path.realpath(p) for p in paths])
        return [
            FakeFinding("TL302", "graph-accumulation", here, LEAK_LINE, 5, "kept with history"),
            FakeFinding("TL401", "host-sync-in-loop", here, 1, 1, "far from the step"),
        ]

    monkeypatch.setattr(trainlint, "lint_paths", lint_paths, raising=False)
    return calls


def test_findings_on_the_step_and_the_functions_it_calls_are_printed(fake_linter):
    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(make_step())
    message = str(info.value)
    assert "trainlint check findings on the step's lines" in message
    assert f"test_runtime_lintlink.py:{LEAK_LINE}:5: TL302 graph-accumulation: kept with" in message
    assert "TL401 host-sync-in-loop: far" not in message  # not on the step's lines
    assert fake_linter == [[os.path.realpath(__file__)]]


def test_a_broken_linter_never_hides_the_runtime_failure(monkeypatch):
    def lint_paths(paths, **kwargs):
        raise RuntimeError("linter mid-refactor")

    monkeypatch.setattr(trainlint, "lint_paths", lint_paths, raising=False)
    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(make_step())
    message = str(info.value)
    assert "graph-accumulation" in message  # from the runtime hints, not the linter
    assert "trainlint check" not in message


def test_spans_cover_the_step_and_project_functions_it_calls():
    step = make_step()
    spans = source_spans([step])
    here = os.path.realpath(__file__)
    starts = {start for path, start, _ in spans if path == here}
    assert inspect.getsourcelines(leaky_training)[1] in starts
    # torch's own functions are never linted
    assert all("site-packages" not in path for path, _, _ in spans)


def test_spans_unwrap_methods_partials_and_callable_objects():
    import functools

    class Trainer:
        def __call__(self):
            return 1

        def step(self, n):
            return n

    trainer = Trainer()
    for target in (trainer, trainer.step, functools.partial(trainer.step, 1)):
        spans = source_spans([target])
        assert spans and spans[0][0] == os.path.realpath(__file__)
    assert source_spans([print]) == []
    assert findings_section([print]) == ""


def test_real_linter_findings_appear_when_it_knows_the_rule(tmp_path):
    source = tmp_path / "train_loop.py"
    source.write_text(
        "from torch import nn\n"
        "\n"
        "history = []\n"
        "\n"
        "\n"
        "def train_step(model, optimizer, x, y):\n"
        "    optimizer.zero_grad()\n"
        "    loss = nn.functional.mse_loss(model(x), y)\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    history.append(loss)\n"
        "\n"
        "\n"
        "def fit(model, optimizer, loader):\n"
        "    for x, y in loader:\n"
        "        train_step(model, optimizer, x, y)\n"
    )
    try:
        findings = trainlint.lint_paths([source])
    except Exception as error:  # the linter is optional here; the runtime half is under test
        pytest.skip(f"linter unavailable: {error}")
    lines = {f.line for f in findings if f.code == "TL302"}
    if not lines:
        pytest.skip("the linter does not report TL302 here yet")
    namespace: dict[str, object] = {}
    exec(compile(source.read_text(), str(source), "exec"), namespace)
    train_step = namespace["train_step"]
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(lambda: train_step(model, opt, x, y))
    message = str(info.value)
    assert f"train_loop.py:{min(lines)}:" in message
    assert "TL302 graph-accumulation" in message.split("findings on the step's lines")[1]


def test_findings_in_a_module_the_step_reaches_through_an_attribute(tmp_path, monkeypatch):
    """Issue 14: `mod.train(...)` hides the function from the step's bytecode (a module
    global); the failure message still lints the lines the step actually ran."""
    trainer_module, tl302_line = accumulating_trainer_module(tmp_path, monkeypatch, "proj")

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history: list = []
    batches = [batch()]

    with pytest.raises(CheckFailed) as info:
        assert_memory_stable(lambda: trainer_module.train(model, opt, batches, history))
    message = str(info.value)
    assert f"trainer.py:{tl302_line}:" in message
    assert "TL302" in message.split("findings on the step's lines")[1]


def test_findings_of_the_rules_the_failure_names_come_first(monkeypatch):
    here = os.path.realpath(__file__)
    first = inspect.getsourcelines(leaky_training)[1]

    def lint_paths(paths, **kwargs):
        return [
            FakeFinding("TL401", "host-sync-in-loop", here, first + 1, 5, "unrelated, earlier"),
            FakeFinding("TL110", "clip-after-step", here, first + 2, 5, "see also"),
            FakeFinding("TL302", "graph-accumulation", here, LEAK_LINE, 5, "kept with history"),
        ]

    monkeypatch.setattr(trainlint, "lint_paths", lint_paths)
    block = findings_section([leaky_training], ["TL302", "TL110"]).splitlines()
    assert [line.split(": ")[1].split()[0] for line in block[1:]] == ["TL302", "TL110", "TL401"]
    # without rules named: by place, as before
    block = findings_section([leaky_training]).splitlines()
    assert [line.split(": ")[1].split()[0] for line in block[1:]] == ["TL401", "TL110", "TL302"]


# Issue 32: the factory lives in a helper module that a fixture hands the test (or that
# conftest imports); the lint block must lint that module's lines, not only the test's.
SCHEDULES = """
import torch


def make_scheduler(optimizer, warmup_steps=5):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / warmup_steps)
"""

MODELS = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        # a hidden activation: the memory check tags the graph through what it saves
        self.layer = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        self.total = 0.0

    def forward(self, x):
        out = self.layer(x)
        self.total = self.total + out.sum()  # chains every step's graph to the next
        return out
"""

FIXTURE_CONFTEST = """
import pytest
import torch

import models
import schedules


@pytest.fixture
def sched_module():
    return schedules


@pytest.fixture
def factory():
    return lambda opt: schedules.make_scheduler(opt)


@pytest.fixture
def model_step():
    model = models.Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)

    def step():
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return step
"""

FIXTURE_TESTS = """
def test_module_from_a_fixture(sched_module, assert_lr_schedule):
    assert_lr_schedule(lambda opt: sched_module.make_scheduler(opt), steps=10)


def test_factory_from_a_fixture(factory, assert_lr_schedule):
    assert_lr_schedule(factory, steps=10)


def test_model_class_from_a_fixture(model_step, assert_memory_stable):
    assert_memory_stable(model_step, steps=12)
"""


def test_a_factory_reached_through_a_fixture_provided_module_is_linted(pytester):
    pytester.makepyfile(schedules=SCHEDULES, models=MODELS, conftest=FIXTURE_CONFTEST)
    pytester.makepyfile(test_through_fixtures=FIXTURE_TESTS)
    tl203 = trainlint.lint_paths([pytester.path / "schedules.py"])
    assert [f.code for f in tl203] == ["TL203"]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=3)
    # the failures section only: under CI=true pytest repeats each message untruncated in its
    # short summary, which would count every block twice
    out = result.stdout.str().split("short test summary info")[0]
    blocks = out.split("on the step's lines")[1:]
    assert len(blocks) == 3, out
    for block in blocks[:2]:
        assert f"schedules.py:{tl203[0].line}:{tl203[0].column}: TL203" in block
    # the model's class, reached through the object the step closes over: its forward
    assert "models.py:" in blocks[2].splitlines()[0]
