"""The ecosystem check (bench/ecosystem.py), offline: a thin front end over bench/corpus.py.

Nothing here downloads: the end-to-end test puts a tiny package straight into the
unpacked-source cache, where the script looks before it would fetch anything, and
makes any fetch fail loudly. tests/test_corpus.py covers the shared comparison and gate.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def eco():
    spec = importlib.util.spec_from_file_location("trainlint_bench_ecosystem", BENCH / "ecosystem.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_front_end_uses_the_shared_corpus_module(eco):
    assert eco.SCHEMA.source == "package" and eco.SCHEMA.pin == "version"
    assert eco.corpus.__file__ == str(BENCH / "corpus.py")
    assert eco.SCHEMA.fields[:2] == ("package", "version")
    assert {"template", "context"} <= set(eco.SCHEMA.fields)


def test_packages_file_parses_and_names_are_unique(eco):
    pkgs = eco.load_packages()
    assert len(pkgs) >= 20
    assert len({p.name for p in pkgs}) == len(pkgs)
    assert all(len(p.sha256) == 64 for p in pkgs)


def test_the_committed_ledger_is_migrated(eco):
    """Every entry carries the new key's template and the context a version bump checks,
    and every opt_in names its rule's option in the gate's form."""
    entries = eco.corpus.read_ledger(eco.LEDGER_FILE, eco.SCHEMA)
    assert entries
    assert all("template" in e and e.get("context") for e in entries)
    rules = eco.corpus.rule_table()
    for e in entries:
        if e.get("opt_in"):
            assert not isinstance(eco.corpus.parse_opt_in(e["opt_in"], e["code"], rules), str), e


# --------------------------------------------------------------------------- end to end

HEADER = "# a fake package\n# used offline\n# by this test\nimport torch\n\n"
BUG = "torch.autograd.set_detect_anomaly(True)\n"


def _fake_package(tmp_path: Path, version: str = "0.1") -> tuple[Path, list[str]]:
    packages = tmp_path / "packages.toml"
    packages.write_text(
        f'[[package]]\nname = "fakepkg"\nversion = "{version}"\nartifact = "sdist"\n'
        'filename = "fakepkg.tar.gz"\nsha256 = "0"\n',
        encoding="utf-8",
    )
    cache = tmp_path / "cache"
    root = cache / "src" / f"fakepkg-{version}"
    (root / "fakepkg").mkdir(parents=True, exist_ok=True)
    (root / ".ecosystem-complete").write_text("", encoding="utf-8")
    base = ["--packages-file", str(packages), "--ledger", str(tmp_path / "ledger.jsonl"),
            "--cache-dir", str(cache), "--select", "TL403"]
    return root / "fakepkg" / "train.py", base


@pytest.mark.slow
def test_end_to_end_on_a_fake_package_without_downloading(eco, tmp_path, monkeypatch, capsys):
    def no_network(*args, **kwargs):
        raise AssertionError("the offline test tried to download")

    monkeypatch.setattr(eco, "simple_index_files", no_network)
    monkeypatch.setattr(eco, "download", no_network)
    train, base = _fake_package(tmp_path)
    ledger = tmp_path / "ledger.jsonl"
    train.write_text(HEADER + BUG, encoding="utf-8")

    assert eco.main([*base, "--update", "--check"]) == 1  # the new finding is unreviewed
    assert "NEW  fakepkg fakepkg/train.py:6: TL403" in capsys.readouterr().out
    (written,) = eco.corpus.read_ledger(ledger, eco.SCHEMA)
    assert written["verdict"] == "unreviewed" and written["line"] == 6
    assert written["text"] == "torch.autograd.set_detect_anomaly(True)"
    assert written["template"] and written["context"]
    assert (tmp_path / "cache" / "src" / "trainlint.toml").is_file()  # config discovery stops there

    eco.corpus.write_ledger([{**written, "verdict": "true", "reason": "left on"}], ledger, eco.SCHEMA)
    assert eco.main([*base, "--check", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["new"] == [] and summary["gone"] == [] and summary["reopened"] == []
    assert summary["rules"]["TL403"]["precision"] == 1.0
    assert summary["packages"][0]["files"] == 1

    # A new release that only adds lines far above: the review carries over.
    train2, base2 = _fake_package(tmp_path, "0.2")
    train2.write_text("# new\n" * 10 + HEADER + BUG, encoding="utf-8")
    assert eco.main([*base2, "--check", "--update"]) == 0
    (kept,) = eco.corpus.read_ledger(ledger, eco.SCHEMA)
    assert (kept["verdict"], kept["version"], kept["line"]) == ("true", "0.2", 16)

    # A release that edits the lines around it: the verdict is re-opened.
    train3, base3 = _fake_package(tmp_path, "0.3")
    train3.write_text(HEADER.replace("import torch", "import torch, os") + BUG, encoding="utf-8")
    assert eco.main([*base3, "--check"]) == 1
    assert "REOPENED fakepkg fakepkg/train.py:6: TL403 [was true at 0.2]" in capsys.readouterr().out

    train3.write_text("import torch\n", encoding="utf-8")  # the bug is fixed upstream
    assert eco.main([*base3, "--check"]) == 1  # ... which loses a true finding
    assert "GONE fakepkg fakepkg/train.py:16: TL403 [true]" in capsys.readouterr().out
    assert eco.main([*base3, "--update", "--prune"]) == 0
    assert eco.corpus.read_ledger(ledger, eco.SCHEMA) == []
