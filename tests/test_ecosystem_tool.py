"""The ecosystem check's comparison logic (bench/ecosystem.py), offline.

Nothing here downloads: the end-to-end test puts a tiny package straight into the
unpacked-source cache, where the script looks before it would fetch anything, and
makes any fetch fail loudly.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "ecosystem.py"


@pytest.fixture(scope="module")
def eco():
    spec = importlib.util.spec_from_file_location("trainlint_bench_ecosystem", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def rec(path="a.py", line=1, code="TL401", text="x.item()", package="pkg", message="m"):
    return {
        "package": package,
        "version": "1.0",
        "path": path,
        "line": line,
        "code": code,
        "text": text,
        "message": message,
    }


def entry(verdict, reason="r", **kw):
    return {**rec(**kw), "verdict": verdict, "reason": reason}


# --------------------------------------------------------------------------- compare


def test_new_gone_and_matched_on_the_normalised_line_not_the_line_number(eco):
    ledger = [
        entry("true", line=10, text="loss.item()"),
        entry("false", line=20, text="y.cpu()"),
        entry("noise", line=30, code="TL702", text="torch.load(p)"),  # no longer produced
        entry("true", package="other", text="z.item()"),  # other package
    ]
    current = [
        rec(line=14, text="loss.item()"),  # shifted by 4 lines: still the same finding
        rec(line=24, text="y.cpu()"),
        rec(line=40, text="w.tolist()"),  # never reviewed
    ]
    cmp = eco.compare(current, ledger, packages={"pkg"}, codes={"TL401", "TL702"})
    assert [r["text"] for r in cmp.new] == ["w.tolist()"]
    assert [e["text"] for e in cmp.gone] == ["torch.load(p)"]
    assert [e["package"] for e in cmp.untouched] == ["other"]
    verdicts = sorted(v for _, v in cmp.verdict_of())
    assert verdicts == ["false", "true", "unreviewed"]


def test_the_same_key_twice_pairs_in_line_order_and_the_far_entry_is_gone(eco):
    ledger = [entry("true", line=5), entry("false", line=50), entry("noise", line=90)]
    current = [rec(line=6), rec(line=88)]
    cmp = eco.compare(current, ledger, packages={"pkg"}, codes=None)
    assert [(c["line"], e["verdict"]) for c, e in cmp.matched] == [(6, "true"), (88, "noise")]
    assert [e["verdict"] for e in cmp.gone] == ["false"]
    assert cmp.new == []


def test_more_findings_than_entries_for_a_key_are_new(eco):
    cmp = eco.compare(
        [rec(line=1), rec(line=9)], [entry("true", line=1)], packages={"pkg"}, codes=None
    )
    assert [c["line"] for c, _ in cmp.matched] == [1]
    assert [r["line"] for r in cmp.new] == [9]


def test_rules_outside_the_selection_are_not_gone(eco):
    ledger = [entry("true", code="TL101", text="clip()"), entry("true", code="TL401")]
    cmp = eco.compare([], ledger, packages={"pkg"}, codes={"TL401"})
    assert [e["code"] for e in cmp.gone] == ["TL401"]
    assert [e["code"] for e in cmp.untouched] == ["TL101"]


def test_normalise_collapses_whitespace_only(eco):
    assert eco.normalise("    x =  a.item()\t# keep\n") == "x = a.item() # keep"


# --------------------------------------------------------------------------- arithmetic


def test_precision_counts_noise_against_the_rule_and_ignores_unreviewed(eco):
    assert eco.precision({"true": 9, "false": 0, "noise": 1, "unreviewed": 7}) == 0.9
    assert eco.precision({"true": 1, "false": 1, "noise": 2}) == 0.25
    assert eco.precision({"unreviewed": 3}) is None


def test_per_rule_tally_and_the_check_gate(eco):
    ledger = (
        [entry("true", line=i, text=f"t{i}") for i in range(8)]
        + [entry("false", line=100, text="f"), entry("noise", line=101, text="n")]
        + [entry("false", code="TL002", text="off")]
    )
    current = [rec(line=e["line"], code=e["code"], text=e["text"]) for e in ledger]
    cmp = eco.compare(current, ledger, packages={"pkg"}, codes=None)
    per_rule = eco.tally(cmp.verdict_of(), "code")
    assert per_rule["TL401"] == {"findings": 10, "true": 8, "false": 1, "noise": 1, "unreviewed": 0}
    assert eco.precision(per_rule["TL401"]) == pytest.approx(0.8)
    # TL401 (default) at 0.8 fails; TL002 (off by default) at 0.0 does not.
    failures = eco.gate_failures(cmp, default_codes={"TL401"})
    assert len(failures) == 1 and failures[0].startswith("TL401: precision 0.80")
    # The gate holds default-enabled rules only: as an opt-in rule TL401 would pass.
    assert eco.gate_failures(cmp, default_codes=set()) == []


def test_gate_fails_on_unreviewed_and_on_a_lost_true_finding(eco):
    cmp = eco.compare(
        [rec(text="new()")], [entry("true", text="was_true()")], packages={"pkg"}, codes=None
    )
    failures = eco.gate_failures(cmp, default_codes={"TL401"})
    assert any("not reviewed" in f for f in failures)
    assert any("reviewed as true are GONE" in f for f in failures)
    cmp = eco.compare([], [entry("false", text="was_false()")], packages={"pkg"}, codes=None)
    assert eco.gate_failures(cmp, default_codes={"TL401"}) == []  # a false alarm fixed


def test_a_true_finding_moved_to_an_opt_in_option_may_be_gone(eco):
    moved = {**entry("true", text="was_true()"), "opt_in": "allow-loss-item = false"}
    cmp = eco.compare([], [moved], packages={"pkg"}, codes=None)
    assert eco.gate_failures(cmp, default_codes={"TL401"}) == []


def test_update_keeps_reviews_adds_new_and_prunes_only_when_asked(eco):
    ledger = [
        entry("true", line=3, text="kept", reason="real"),
        entry("noise", line=7, text="gone"),
    ]
    current = [rec(line=5, text="kept", message="reworded"), rec(line=9, text="fresh")]
    cmp = eco.compare(current, ledger, packages={"pkg"}, codes=None)
    kept = eco.updated_ledger(cmp, prune=False)
    by_text = {e["text"]: e for e in kept}
    assert by_text["kept"]["verdict"] == "true" and by_text["kept"]["reason"] == "real"
    assert by_text["kept"]["line"] == 5 and by_text["kept"]["message"] == "reworded"
    assert by_text["fresh"]["verdict"] == "unreviewed"
    assert "gone" in by_text
    pruned = eco.updated_ledger(cmp, prune=True)
    assert sorted(e["text"] for e in pruned) == ["fresh", "kept"]


def test_ledger_round_trip_and_validation(eco, tmp_path):
    path = tmp_path / "ledger.jsonl"
    eco.write_ledger([entry("true", line=2, text="b"), entry("unreviewed", line=1, text="a")], path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x)["text"] for x in lines] == ["a", "b"]  # sorted by path, line
    assert list(json.loads(lines[0])) == list(eco.LEDGER_FIELDS)
    assert eco.read_ledger(path)[1]["verdict"] == "true"
    path.write_text(json.dumps(entry("maybe")) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="verdict must be one of"):
        eco.read_ledger(path)


def test_python_files_skip_vendored_folders_and_excludes(eco, tmp_path):
    for rel in (
        "pkg/a.py",
        "pkg/third_party/v.py",
        "examples/b.py",
        "docs/conf.py",
        "pkg/data.json",
        "pkg.egg-info/x.py",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("", encoding="utf-8")
    assert eco.python_files(tmp_path, ["docs"]) == ["examples/b.py", "pkg/a.py"]


# --------------------------------------------------------------------------- end to end


FAKE_SOURCE = """\
import torch

torch.autograd.set_detect_anomaly(True)
"""


def test_end_to_end_on_a_fake_package_without_downloading(eco, tmp_path, monkeypatch, capsys):
    def no_network(*args, **kwargs):
        raise AssertionError("the offline test tried to download")

    monkeypatch.setattr(eco, "simple_index_files", no_network)
    monkeypatch.setattr(eco, "download", no_network)
    packages = tmp_path / "packages.toml"
    packages.write_text(
        '[[package]]\nname = "fakepkg"\nversion = "0.1"\nartifact = "sdist"\n'
        'filename = "fakepkg-0.1.tar.gz"\nsha256 = "0"\n',
        encoding="utf-8",
    )
    cache = tmp_path / "cache"
    root = cache / "src" / "fakepkg-0.1"
    (root / "fakepkg").mkdir(parents=True)
    (root / ".ecosystem-complete").write_text("", encoding="utf-8")
    train = root / "fakepkg" / "train.py"
    train.write_text(FAKE_SOURCE, encoding="utf-8")
    ledger = tmp_path / "ledger.jsonl"
    base = [
        "--packages-file",
        str(packages),
        "--ledger",
        str(ledger),
        "--cache-dir",
        str(cache),
        "--select",
        "TL403",
    ]

    assert eco.main([*base, "--update", "--check"]) == 1  # the new finding is unreviewed
    out = capsys.readouterr().out
    assert "NEW  fakepkg fakepkg/train.py:3: TL403" in out
    (written,) = eco.read_ledger(ledger)
    assert written["verdict"] == "unreviewed" and written["line"] == 3
    assert written["text"] == "torch.autograd.set_detect_anomaly(True)"
    assert (cache / "src" / "trainlint.toml").is_file()  # config discovery stops there

    eco.write_ledger([{**written, "verdict": "true", "reason": "left on in a script"}], ledger)
    train.write_text("# a comment\n\n" + FAKE_SOURCE, encoding="utf-8")  # line 3 -> 5
    assert eco.main([*base, "--check", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["new"] == [] and summary["gone"] == []
    assert summary["rules"]["TL403"]["true"] == 1
    assert summary["rules"]["TL403"]["precision"] == 1.0
    assert summary["packages"][0]["files"] == 1

    train.write_text("import torch\n", encoding="utf-8")  # the bug is fixed upstream
    assert eco.main([*base, "--check"]) == 1  # ... which loses a true finding
    assert "GONE fakepkg fakepkg/train.py:3: TL403 [true]" in capsys.readouterr().out
    assert eco.main([*base, "--update", "--prune"]) == 0
    assert eco.read_ledger(ledger) == []
