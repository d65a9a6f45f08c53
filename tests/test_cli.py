"""The command line as a user drives it: exit codes, formats, selection, config errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainlint import __version__

LEAK = """\
import torch

for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward(retain_graph=True)
    optimizer.step()
"""
LOAD = "import torch\nsd = torch.load(path)\n"
CLEAN = "import torch\nx = torch.zeros(3)\n"


def test_version(run_cli, capsys):
    import pytest

    with pytest.raises(SystemExit) as exc:
        run_cli("--version")
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_exit_codes_and_concise(run_cli, tree):
    root = tree({"train.py": LEAK, "clean.py": CLEAN})
    code, out, _ = run_cli("check", str(root / "clean.py"))
    assert code == 0 and "All checks passed" in out
    code, out, _ = run_cli("check", str(root))
    assert code == 1
    assert "train.py:6:5: TL301 retain-graph-in-loop:" in out
    # how many files have findings, of how many were checked
    assert out.splitlines()[-2] == "Found 1 finding in 1 of 2 files."


def test_exit_zero_quiet_statistics(run_cli, tree):
    root = tree({"train.py": LEAK, "load.py": LOAD})
    code, out, _ = run_cli("check", "--exit-zero", "--quiet", str(root))
    assert code == 0 and "Found" not in out and "TL301" in out
    # (TL702 is off by default: selected here for a second finding)
    more = ("--extend-select", "TL702")
    code, out, _ = run_cli("check", "--statistics", "--no-cache", *more, str(root))
    assert code == 1
    assert out.split("\n")[0].split() == ["1", "TL301", "retain-graph-in-loop"] or "TL301" in out
    assert "TL702" in out and "train.py:" not in out
    assert "Found 2 findings in 2 of 2 files." in out.splitlines()  # the total
    code, out, _ = run_cli("check", "--statistics", "--quiet", "--no-cache", *more, str(root))
    assert "Found" not in out and len(out.splitlines()) == 2


def test_diff_exit_status_ignores_findings_without_a_fix(run_cli, tree):
    # TL301's fix is unsafe: without --unsafe-fixes there is nothing to show
    root = tree({"train.py": LEAK})
    code, out, err = run_cli("check", "--diff", "--no-cache", str(root))
    assert code == 0 and out == ""
    assert "Would fix 0 findings; 1 finding would remain" in err
    code, out, err = run_cli("check", "--diff", "--unsafe-fixes", "--no-cache", str(root))
    assert code == 1 and "+    loss.backward()" in out
    assert err.strip() == "Would fix 1 finding."


def test_select_ignore_prefixes(run_cli, tree):
    root = tree({"train.py": LEAK, "load.py": LOAD})
    code, out, _ = run_cli("check", "--select", "TL7", str(root))
    assert "TL702" in out and "TL301" not in out
    code, out, _ = run_cli("check", "--ignore", "TL3,TL70", str(root))
    assert code == 0
    code, out, _ = run_cli("check", "--select", "TL3", "--extend-select", "TL702", str(root))
    assert "TL702" in out and "TL301" in out
    # the more specific selector wins
    code, out, _ = run_cli("check", "--ignore", "TL", "--extend-select", "TL301", str(root))
    assert "TL301" in out and "TL702" not in out


def test_unknown_selector_is_usage_error(run_cli, tree):
    root = tree({"a.py": CLEAN})
    code, _, err = run_cli("check", "--select", "TL999", str(root))
    assert code == 2 and "TL999" in err


def test_json_and_full(run_cli, tree):
    root = tree({"train.py": LEAK})
    code, out, _ = run_cli("check", "--output-format", "json", str(root))
    data = json.loads(out)
    assert code == 1 and len(data) == 1
    f = data[0]
    assert {k: f[k] for k in ("code", "name", "line", "column", "end_line", "end_column")} == {
        "code": "TL301",
        "name": "retain-graph-in-loop",
        "line": 6,
        "column": 5,
        "end_line": 6,
        "end_column": 37,
    }
    assert f["severity"] == "error" and f["fix"]["applicability"] == "unsafe"
    code, out, _ = run_cli("check", "--show-source", str(root))
    assert "loss.backward(retain_graph=True)" in out and "^^^^" in out


def test_sarif_shape(run_cli, tree):
    root = tree({"train.py": LEAK, "load.py": LOAD})
    _, out, _ = run_cli("check", "--output-format", "sarif", "--extend-select", "TL702", str(root))
    doc = json.loads(out)
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert "TL301" in rules and rules["TL301"]["helpUri"].endswith("TL301.md")
    results = run["results"]
    assert {r["ruleId"] for r in results} == {"TL301", "TL702"}
    for r in results:
        region = r["locations"][0]["physicalLocation"]["region"]
        assert region["startLine"] >= 1 and region["startColumn"] >= 1
        assert run["tool"]["driver"]["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
    # One source of truth: a result's level is its rule's declared level (issue 17, item 5).
    for r in results:
        declared = run["tool"]["driver"]["rules"][r["ruleIndex"]]["defaultConfiguration"]
        assert r["level"] == declared["level"]
    assert {r["ruleId"]: r["level"] for r in results}["TL702"] == "error"


def test_github_annotations(run_cli, tree):
    root = tree({"train.py": LEAK})
    _, out, _ = run_cli("check", "--output-format", "github", str(root))
    assert out.startswith("::error file=")
    assert "line=6,col=5" in out and "title=TL301 retain-graph-in-loop::" in out


def test_rules_and_rule(run_cli):
    code, out, _ = run_cli("rules")
    assert code == 0
    assert "TL301" in out and "retain-graph-in-loop" in out and "unsafe" in out
    assert "TL002" in out and "off" in out
    code, out, _ = run_cli("rule", "TL301")
    assert code == 0
    for section in (
        "## What it does",
        "## Why is this bad?",
        "## Example",
        "## Use instead",
        "## Fix safety",
        "## References",
    ):
        assert section in out
    code, _, err = run_cli("rule", "TL999")
    assert code == 2 and "TL999" in err


def test_missing_path(run_cli, tmp_path):
    code, _, err = run_cli("check", str(tmp_path / "nope.py"))
    assert code == 2 and "nope.py" in err


def test_config_found_upwards_and_per_file_ignores(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint]\nignore = ["TL702"]\n'
            '[tool.trainlint.per-file-ignores]\n"legacy/*" = ["TL3"]\n',
            "src/pkg/train.py": LEAK + LOAD.replace("import torch\n", ""),
            "legacy/old.py": LEAK,
        }
    )
    code, out, _ = run_cli("check", str(root / "src"), str(root / "legacy"))
    assert "train.py:6:5: TL301" in out
    assert "TL702" not in out
    assert "old.py" not in out


def test_trainlint_toml_and_rule_options(run_cli, tree):
    root = tree(
        {
            "trainlint.toml": 'extend-select = ["TL702"]\n'
            "[rules.TL702]\nrequire-explicit = false\nreport-explicit-false = true\n",
            "load.py": LOAD + "sd2 = torch.load(p, weights_only=False)\n",
        }
    )
    code, out, _ = run_cli("check", str(root))
    assert code == 1
    assert "load.py:3:" in out and "load.py:2:" not in out


def test_bad_config_names_key_and_file(run_cli, tree):
    root = tree({"pyproject.toml": "[tool.trainlint]\nselct = ['TL1']\n", "a.py": CLEAN})
    code, _, err = run_cli("check", str(root))
    assert code == 2
    assert "selct" in err and "pyproject.toml" in err
    root = tree({"pyproject.toml": "[tool.trainlint.rules.TL702]\nrequire-explict = 1\n"})
    code, _, err = run_cli("check", str(root))
    assert code == 2 and "require-explict" in err
    root = tree({"pyproject.toml": "[tool.trainlint.rules.TL702]\nrequire-explicit = 1\n"})
    code, _, err = run_cli("check", str(root))
    assert code == 2 and "require-explicit" in err and "bool" in err
    root = tree({"pyproject.toml": "[tool.trainlint]\nselect = ['TL9']\n"})
    code, _, err = run_cli("check", str(root))
    assert code == 2 and "TL9" in err
    root = tree({"pyproject.toml": "[tool.trainlint\n"})
    code, _, err = run_cli("check", str(root))
    assert code == 2 and "TOML" in err


def test_unknown_code_in_per_file_ignores_names_key_and_file(run_cli, tree):
    # `TL1O1` with a letter O: it used to pass silently and ignore nothing
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint.per-file-ignores]\n"tests/*" = ["TL1O1"]\n',
            "tests/test_a.py": LEAK,
        }
    )
    code, out, err = run_cli("check", str(root))
    assert code == 2 and out == ""
    assert "TL1O1" in err and "per-file-ignores" in err and "tests/*" in err
    assert str(root / "pyproject.toml") in err
    (root / "pyproject.toml").write_text(
        '[tool.trainlint.per-file-ignores]\n"tests/*" = ["TL3", "TL702"]\n'
    )
    code, out, _ = run_cli("check", str(root))
    assert code == 0, out


def test_explicit_config_flag(run_cli, tree):
    root = tree({"cfg/custom.toml": "select = ['TL7']\n", "train.py": LEAK + "torch.load(p)\n"})
    code, out, _ = run_cli("check", "--config", str(root / "cfg/custom.toml"), str(root))
    assert "TL702" in out and "TL301" not in out
    code, _, err = run_cli("check", "--config", str(root / "missing.toml"), str(root))
    assert code == 2 and "missing.toml" in err


def test_exclude_and_extend_exclude(run_cli, tree):
    root = tree(
        {"gen/a.py": LEAK, "b.py": LEAK, "pyproject.toml": "[tool.trainlint]\nexclude=['gen']\n"}
    )
    code, out, _ = run_cli("check", str(root))
    assert "b.py" in out and "gen" not in out
    code, out, _ = run_cli("check", "--exclude", "b.py", str(root))
    assert "gen/a.py" in out and "b.py:" not in out.replace("gen/a.py", "")
    code, out, _ = run_cli("check", "--extend-exclude", "b.py", str(root))
    assert code == 0


def test_internal_error_is_reported_and_other_findings_kept(run_cli, tree, monkeypatch):
    from trainlint.rules.throughput import AnomalyDetectionEnabled

    def boom(self, model):
        raise ValueError("kaboom")
        yield  # pragma: no cover

    monkeypatch.setattr(AnomalyDetectionEnabled, "check", boom)
    root = tree({"train.py": LEAK + "torch.autograd.set_detect_anomaly(True)\n"})
    code, out, err = run_cli("check", "--jobs", "1", str(root))
    assert code == 2
    assert "TL301" in out
    assert "TL403" in err and "train.py" in err and "kaboom" in err


def test_parallel_jobs_same_output(run_cli, tree):
    files = {f"m{i}.py": LEAK for i in range(12)}
    root = tree(files)
    _, serial, _ = run_cli("check", "--jobs", "1", str(root))
    _, parallel, _ = run_cli("check", "--jobs", "2", str(root))
    assert serial == parallel and serial.count("TL301") == 12


def test_module_entry_point(tmp_path):
    p = tmp_path / "t.py"
    p.write_text(LEAK)
    proc = subprocess.run(
        [sys.executable, "-m", "trainlint", "check", str(p)], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "TL301" in proc.stdout


def test_cache_warm_run_and_invalidation(run_cli, tree, monkeypatch):
    import trainlint.engine as engine

    root = tree({"train.py": LEAK, "pyproject.toml": "[tool.trainlint]\n"})
    code, cold, _ = run_cli("check", "--jobs", "1", str(root))
    assert code == 1 and (root / ".trainlint_cache").is_dir()
    assert (root / ".trainlint_cache" / ".gitignore").read_text().strip().endswith("*")
    calls = []
    real = engine.Linter.lint_bytes
    monkeypatch.setattr(
        engine.Linter, "lint_bytes", lambda self, *a, **k: calls.append(1) or real(self, *a, **k)
    )
    code, warm, _ = run_cli("check", "--jobs", "1", str(root))
    assert warm == cold and code == 1 and calls == []
    # another selection is another cache entry
    code, out, _ = run_cli("check", "--jobs", "1", "--select", "TL7", str(root))
    assert code == 0 and calls == [1]
    # an edit is a miss
    (root / "train.py").write_text(LEAK.replace("retain_graph=True", "retain_graph=False"))
    code, out, _ = run_cli("check", "--jobs", "1", str(root))
    assert code == 0 and len(calls) == 2
    # --no-cache never reads it
    code, out, _ = run_cli("check", "--jobs", "1", "--no-cache", str(root))
    assert len(calls) == 3


def test_corrupt_cache_entry_is_a_miss(run_cli, tree):
    root = tree({"train.py": LEAK, "pyproject.toml": "[tool.trainlint]\n"})
    _, cold, _ = run_cli("check", "--jobs", "1", str(root))
    for entry in (root / ".trainlint_cache").rglob("*.json"):
        entry.write_text('{"key": "trunc')
    code, warm, err = run_cli("check", "--jobs", "1", str(root))
    assert warm == cold and code == 1 and err == ""


def test_cache_is_keyed_on_trainlints_own_code(tmp_path):
    # a checkout changes what it reports without changing its version
    import shutil

    from trainlint import cli

    package = tmp_path / "trainlint"
    shutil.copytree(
        Path(cli.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__")
    )
    before = cli.code_fingerprint(package)
    assert before == cli.code_fingerprint.__wrapped__(package)
    with (package / "notebook.py").open("a") as fh:
        fh.write("# masking changed\n")
    assert cli.code_fingerprint.__wrapped__(package) != before
    # an edit that keeps the size is told by the module's time
    edited = cli.code_fingerprint.__wrapped__(package)
    engine = package / "engine.py"
    text = engine.read_text(encoding="utf-8")
    engine.write_text(text.replace("Lint one file", "Lint any file", 1), encoding="utf-8")
    assert engine.stat().st_size == len(text.encode())
    assert cli.code_fingerprint.__wrapped__(package) != edited


def test_every_finding_has_its_rules_severity(run_cli):
    """Issue 17, item 5: one source of truth. Every finding over the fixtures (the snapshot
    the snapshot test keeps current) carries the severity `trainlint rules` lists for its
    rule, which is also the level SARIF declares for it."""
    from trainlint.reporting.sarif import format_sarif
    from trainlint.rules import builtin_rules

    snapshot = Path(__file__).parent / "snapshots" / "fixtures.json"
    findings = json.loads(snapshot.read_text(encoding="utf-8"))
    code, out, _ = run_cli("rules", "--output-format", "json")
    listed = {r["code"]: r["severity"] for r in json.loads(out)}
    mismatched = {
        (f["code"], f["severity"], listed[f["code"]])
        for f in findings
        if f["severity"] != listed[f["code"]]
    }
    assert mismatched == set()
    rules = builtin_rules()
    driver = json.loads(format_sarif([], rules))["runs"][0]["tool"]["driver"]["rules"]
    assert {r["id"]: r["defaultConfiguration"]["level"] for r in driver} == {
        r.code: r.severity for r in rules
    }
    assert "TL704" in {f["code"] for f in findings}
    assert {f["severity"] for f in findings} == {"error", "warning"}


def test_a_reader_that_leaves_early_gets_no_traceback():
    # `trainlint check . | head -1`: the pipe closes while findings are still printed
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainlint",
            "check",
            "--no-cache",
            "--output-format",
            "full",
            "--statistics",
            "fixtures",
        ],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the first finding is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
