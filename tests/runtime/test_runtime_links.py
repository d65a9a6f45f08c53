"""The rule-to-check link: ``Rule.confirm_with`` is its one source.

A failing check may confirm (put in ``CheckFailed.rules``) only rules whose ``confirm_with``
names it, and every rule that names a check must be one that check's diagnosis can list.
Everything is read from the registry, so these tests follow a change of ``confirm_with``.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from runtime_helpers import batch, clean_setup, mlp
from torch import nn
from torch.optim import lr_scheduler

import trainlint.testing
from trainlint._runtime import links
from trainlint._runtime.links import Symptom, explain, rule_info, rules_confirmed_by, symptoms_of
from trainlint.rules import builtin_rules
from trainlint.testing import CheckFailed

CHECKS = [name for name in trainlint.testing.__all__ if name.startswith("assert_")]
REGISTRY = {rule.code: rule for rule in builtin_rules()}


def _linked_rules() -> list[object]:
    params = []
    for code, rule in sorted(REGISTRY.items()):
        if not rule.confirm_with:
            continue
        params.append(pytest.param(rule, id=code))
    return params


@pytest.mark.parametrize("rule", _linked_rules())
def test_a_rule_names_a_check_that_lists_it_back(rule):
    check = rule.confirm_with
    assert check in CHECKS, f"{rule.code}: confirm_with={check!r} is not a trainlint.testing check"
    explainable = {code for s in symptoms_of(check).values() for code in s.explained_by}
    assert rule.code in explainable, (
        f"{rule.code} names {check}, but no symptom of {check} is explained by it"
    )
    assert rule.code in rules_confirmed_by(check)


@pytest.mark.parametrize("check", CHECKS)
def test_symptom_tables_name_only_registered_rules(check):
    for key, symptom in symptoms_of(check).items():
        for code in (*symptom.explained_by, *symptom.see_also):
            assert code in REGISTRY, f"{check} symptom {key!r} names unknown rule {code}"


def test_symptoms_of_an_unknown_check_is_an_error():
    with pytest.raises(KeyError, match="assert_no_such_check"):
        symptoms_of("assert_no_such_check")
    with pytest.raises(KeyError):
        symptoms_of("CheckFailed")  # public, but not a check


def test_rule_info_and_rules_confirmed_by_come_from_the_registry():
    for code, rule in REGISTRY.items():
        info = rule_info(code)
        assert info is not None
        assert (info.name, info.message, info.confirm_with) == (
            rule.name,
            rule.message,
            rule.confirm_with,
        )
    assert rule_info("TL999") is None
    for check in CHECKS:
        expected = sorted(c for c, r in REGISTRY.items() if r.confirm_with == check)
        assert list(rules_confirmed_by(check)) == expected


def test_explain_keeps_the_symptom_order_and_moves_the_rest_to_see_also():
    check = "assert_memory_stable"
    mine = [c for c in ("TL304", "TL302") if REGISTRY[c].confirm_with == check]
    others = sorted(c for c, r in REGISTRY.items() if r.confirm_with not in (None, check))[:2]
    symptom = Symptom(explained_by=(*others[:1], "TL304", "TL302"), see_also=(others[1],))
    explanation = explain(check, [symptom, symptom])
    assert explanation.rules == tuple(mine)
    assert explanation.see_also == (others[0], others[1])
    assert explain(check, [Symptom(explained_by=("TL999",))]).see_also == ()


def _expected(check: str, *symptoms: str) -> tuple[str, ...]:
    table = symptoms_of(check)
    codes = dict.fromkeys(c for s in symptoms for c in table[s].explained_by)
    return tuple(c for c in codes if REGISTRY[c].confirm_with == check)


def _assert_report_confirms_only(failure: CheckFailed) -> None:
    """Fed to the confirmation report, the failure confirms exactly the findings it lists.

    One finding of every registered code on a line the failing test ran: those whose code
    is in ``failure.rules`` are confirmed, every other one is only exercised.
    """
    from pathlib import Path

    from trainlint.confirm import build_report, check_failures
    from trainlint.findings import Finding

    root = Path("/project")
    path = root / "train.py"
    findings = [
        Finding(
            code=code,
            name=rule.name,
            path=str(path),
            line=i,
            column=1,
            end_line=i,
            end_column=2,
            message=rule.message,
        )
        for i, (code, rule) in enumerate(sorted(REGISTRY.items()), 1)
    ]
    executed = {path: {f.line: {"t::failing"} for f in findings}}
    report = build_report(findings, executed, {"t::failing": check_failures(failure)}, root)
    confirmed = {f.code for f in report.findings if f.status == "confirmed"}
    assert confirmed == set(failure.rules)
    assert confirmed <= set(rules_confirmed_by(failure.check))
    assert {f.code for f in report.findings if f.status == "exercised"} == (
        set(REGISTRY) - confirmed
    )


def _assert_confirms_only_its_own(failure: CheckFailed, check: str, *symptoms: str) -> None:
    _assert_report_confirms_only(failure)
    assert failure.check == check
    assert failure.rules == _expected(check, *symptoms)
    for code in failure.rules:
        assert REGISTRY[code].confirm_with == check
    message = str(failure)
    for code in failure.rules:
        assert f"{code} {REGISTRY[code].name}" in message
        assert REGISTRY[code].message in message  # the rule's own words, not a hand table


# One planted bug per check; the bug's own rule must be among the confirmed ones whenever
# it names that check.


def _assert_planted(failure: CheckFailed, planted: str) -> None:
    if REGISTRY[planted].confirm_with == failure.check:
        assert planted in failure.rules
    else:
        assert planted not in failure.rules


def test_grads_nonzero_confirms_only_its_rules():
    model = mlp()
    x, y = batch()

    def step():
        model.zero_grad()
        nn.functional.mse_loss(model(x).detach().requires_grad_(), y).backward()  # TL108

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_grads_nonzero(model, step)
    _assert_confirms_only_its_own(info.value, "assert_grads_nonzero", "no-gradient-anywhere")
    _assert_planted(info.value, "TL108")
    # the copies and remotes that also explain it are only pointed to
    assert "See also" in str(info.value)
    assert "TL501 module-sent-to-remote" in str(info.value)


def test_finite_grads_confirms_only_its_rules():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))

    def step():
        model.zero_grad()
        probs = torch.softmax(model(x) * 1e4, dim=1)  # saturated: log(0) = -inf
        loss = nn.functional.nll_loss(torch.log(probs), y)  # TL602
        loss.backward()
        return loss

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_finite_grads(model, step, locate=False)
    _assert_confirms_only_its_own(info.value, "assert_finite_grads", "non-finite")
    _assert_planted(info.value, "TL602")


def test_weights_updated_confirms_only_its_rules():
    model = mlp()
    x, y = batch()

    def step():
        remote = copy.deepcopy(model)  # what a Ray remote receives (TL501)
        opt = torch.optim.SGD(remote.parameters(), lr=0.1)
        nn.functional.mse_loss(remote(x), y).backward()
        opt.step()

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_weights_updated(model, step)
    _assert_confirms_only_its_own(info.value, "assert_weights_updated", "nothing-moved-no-gradient")
    _assert_planted(info.value, "TL501")


def test_memory_stable_confirms_only_its_rules():
    s = clean_setup()
    state = {"total": 0.0}

    def step():
        state["total"] += s.step()  # TL302

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_memory_stable(step)
    _assert_confirms_only_its_own(info.value, "assert_memory_stable", "graph-nodes-grow")
    _assert_planted(info.value, "TL302")


def test_step_time_stable_confirms_only_its_rules():
    s = clean_setup()
    history = []
    rows, w = torch.randn(256, 64), torch.randn(64, 64)

    def step():
        history.append(s.x)
        for _ in history:  # work that grows with every step, without a bound
            rows @ w
        s.step()

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_step_time_stable(step, steps=12)
    _assert_confirms_only_its_own(info.value, "assert_step_time_stable", "slower-each-step")
    # A graph that grows makes steps slower too, but assert_memory_stable confirms it.
    _assert_planted(info.value, "TL302")


def test_lr_schedule_confirms_only_its_rules():
    def factory(opt):
        return lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=6)  # TL201: epochs per batch

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_lr_schedule(factory, steps=60)
    _assert_confirms_only_its_own(info.value, "assert_lr_schedule", "lr-restarts")
    _assert_planted(info.value, "TL201")


def test_loss_decreases_confirms_only_its_rules():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))

    def step():
        opt.zero_grad()
        probs = torch.softmax(model(x), dim=1)
        loss = nn.functional.cross_entropy(probs, y)  # TL602: a double softmax
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_loss_decreases(step)
    _assert_confirms_only_its_own(info.value, "assert_loss_decreases", "loss-falls-too-slowly")
    _assert_planted(info.value, "TL602")


def test_loss_decreases_confirms_a_double_sigmoid():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32, 1)).float()

    def step():
        opt.zero_grad()
        # TL605: BCEWithLogitsLoss squashes the sigmoid's output again; the loss cannot
        # fall below about 0.5 whatever the model learns
        loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        opt.step()
        return loss

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_loss_decreases(step, steps=40)
    _assert_confirms_only_its_own(info.value, "assert_loss_decreases", "loss-falls-too-slowly")
    _assert_planted(info.value, "TL605")


def test_loss_decreases_rising_loss_confirms_only_its_rules():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = batch()

    def step():
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # TL103: no zero_grad, gradients pile up
        opt.step()
        return loss

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_loss_decreases(step, steps=10)
    _assert_confirms_only_its_own(info.value, "assert_loss_decreases", "loss-rises")
    _assert_planted(info.value, "TL103")


class _KeepsStateOnSelf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(8, 16)
        self.head = nn.Linear(16, 1)
        self.hidden = None

    def forward(self, x):
        self.hidden = torch.relu(self.encoder(x))  # TL304, raced over by threads: TL503
        time.sleep(0.002)
        return self.head(self.hidden)


def test_thread_safe_confirms_only_its_rules():
    model = _KeepsStateOnSelf()
    batches = [batch(i, n=16) for i in range(8)]

    def step(b):
        x, y = b
        nn.functional.mse_loss(model(x), y).backward()

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_thread_safe(model, step, batches)
    _assert_confirms_only_its_own(info.value, "assert_thread_safe", "thread-unsafe")
    _assert_planted(info.value, "TL503")
    _assert_planted(info.value, "TL304")


@pytest.mark.parametrize("planted", ["TL101", "TL110"])
def test_clip_effective_confirms_only_its_rules(planted):
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()

    def step():
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        if planted == "TL101":
            opt.zero_grad()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_clip_effective(model, step)
    symptom = "read-after-zero-grad" if planted == "TL101" else "clip-after-step"
    _assert_confirms_only_its_own(info.value, "assert_clip_effective", symptom)
    _assert_planted(info.value, planted)


def test_clip_effective_confirms_tl601_a_clip_before_unscale():
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch()

    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # TL601: still scaled
        scaler.step(opt)
        scaler.update()

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_clip_effective(model, step)
    _assert_confirms_only_its_own(info.value, "assert_clip_effective", "clip-before-unscale")
    _assert_planted(info.value, "TL601")


def test_no_graph_in_eval_confirms_only_its_rules():
    model = mlp()
    x, _ = batch()

    def evaluate():
        model.eval()
        return model(x).argmax(1)  # TL303: no torch.no_grad()

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_no_graph_in_eval(model, evaluate)
    _assert_confirms_only_its_own(info.value, "assert_no_graph_in_eval", "graph-in-eval")
    _assert_planted(info.value, "TL303")


def test_every_check_has_a_planted_bug_test():
    tested = {
        name.removeprefix("test_").removesuffix("_confirms_only_its_rules")
        for name in globals()
        if name.endswith("_confirms_only_its_rules")
    }
    assert {c.removeprefix("assert_") for c in CHECKS} <= tested


def test_a_broken_rule_registry_does_not_hide_the_failure(monkeypatch):
    def broken():
        raise ImportError("rules/ is being split")

    monkeypatch.setattr(links, "_registry", broken)
    s = clean_setup(lr=0.0)
    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_weights_updated(s.model, s.step)
    assert info.value.rules == ()
    assert "Gradients arrived but no parameter moved" in str(info.value)


@pytest.mark.slow  # spawns two gloo ranks
def test_ddp_in_sync_confirms_only_its_rules():
    # The ranks import the planted step from its module (it must pickle).
    from test_runtime_ddp import BATCHES, make_model, no_sync_step

    with pytest.raises(CheckFailed) as info:
        trainlint.testing.assert_ddp_in_sync(make_model, no_sync_step, batches=BATCHES)
    _assert_confirms_only_its_own(info.value, "assert_ddp_in_sync", "ranks-diverged")


def test_the_registry_is_the_rule_classes_metadata():
    # read from the rules' catalog, not the classes: the same codes, names, messages and
    # confirm_with, in the same order
    expected = {r.code: (r.code, r.name, r.message, r.confirm_with) for r in builtin_rules()}
    links._registry.cache_clear()
    got = {
        code: (i.code, i.name, i.message, i.confirm_with) for code, i in links._registry().items()
    }
    assert list(got.items()) == list(expected.items())


_FAILING_CHECK = """
import json, sys
import torch
from torch import nn
from trainlint.testing import CheckFailed, assert_grads_nonzero

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
x, y = torch.randn(32, 8), torch.randn(32, 1)

def step():
    model.zero_grad()
    with torch.no_grad():
        loss = nn.functional.mse_loss(model(x), y)
    loss.requires_grad_(True).backward()

try:
    assert_grads_nonzero(model, step)
except CheckFailed as error:
    rule_modules = [m for m in sys.modules if m.startswith("trainlint.rules.")]
    print(json.dumps({"rules": list(error.rules), "message": str(error), "modules": rule_modules}))
"""


def test_a_failing_check_names_its_rules_without_importing_rule_modules():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, "-c", _FAILING_CHECK], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["rules"] and "TL105" in got["rules"]
    for code in got["rules"]:
        assert f"{code} {REGISTRY[code].name}" in got["message"]
    assert set(got["modules"]) <= {"trainlint.rules._catalog", "trainlint.rules.base"}
