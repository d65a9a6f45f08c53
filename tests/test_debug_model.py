"""Snapshots of ``trainlint debug model FILE`` over a set of fixtures: the step model every
rule reads (loops, events in order, guards, roles). A change to the analysis shows up
here as a diff to review. Regenerate after an intended change with::

    TRAINLINT_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_debug_model.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainlint.cli import main

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "debug_model"
UPDATE = os.environ.get("TRAINLINT_UPDATE_SNAPSHOTS") == "1"

# One or two per family, chosen for what they exercise: helper calls and guards
# (trainer classes), epoch loops, AMP paths, escapes, schedulers, a file without torch.
FIXTURES = [
    "gradients/clean_trainer_class_amp_branches.py",
    "gradients/clean_dcgan_two_optimizers.py",
    "gradients/tl110_clip_helper_called_after_step.py",
    "gradients/tl104_accelerate_step_before_backward.py",
    "numerics/tl604_a_second_step_after_scaler_step.py",
    "numerics/clean_amp_ddp_train_validate.py",
    "concurrency/tl503_two_threads_same_model.py",
    "concurrency/tl504_imagenet_style_conditional_sampler.py",
    "schedules/tl204_factory_scheduler_dropped_by_caller.py",
    "schedules/tl204_trainer_scheduler_only_checkpointed.py",
    "memory/tl303_validate_after_eval_without_no_grad.py",
    "gradients/clean_no_torch_micrograd.py",
    # a loop whose step runs in another module's function (issue 13): the cross-file call
    # resolved through the files the linted one imports, its events at the call
    "projects/xfile_sched_order_pos/main.py",
]


def _existing() -> list[str]:
    return [f for f in FIXTURES if (ROOT / "fixtures" / f).exists()]


@pytest.mark.parametrize("fixture", _existing())
def test_step_model_matches_snapshot(fixture: str, capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["debug", "model", f"fixtures/{fixture}"]) == 0
    got = capsys.readouterr().out
    path = SNAPSHOTS / (fixture.replace("/", "__").removesuffix(".py") + ".txt")
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"{path.name} did not exist; written, review and commit it")
    assert got == path.read_text(encoding="utf-8")


def test_snapshot_set_is_not_empty() -> None:
    assert len(_existing()) >= 8


def test_debug_model_reports_unreadable_and_broken_files(tmp_path, capsys) -> None:
    assert main(["debug", "model", str(tmp_path / "missing.py")]) == 2
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n", encoding="utf-8")
    assert main(["debug", "model", str(bad)]) == 1
    assert "bad.py:1" in capsys.readouterr().err


def test_debug_model_is_stable_across_runs(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    fixture = f"fixtures/{_existing()[0]}"
    main(["debug", "model", fixture])
    first = capsys.readouterr().out
    main(["debug", "model", fixture])
    assert capsys.readouterr().out == first
