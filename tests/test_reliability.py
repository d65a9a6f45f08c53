"""Never crash, never lose a byte: sweeps, fuzzing, hostile inputs, fault isolation."""

from __future__ import annotations

import ast
import importlib.util
import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from trainlint.config import Settings, select_rules
from trainlint.engine import Linter
from trainlint.fix import fix_text
from trainlint.rules import builtin_rules
from trainlint.runner import FixMode, display_path, run

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
ALL = select_rules(builtin_rules(), Settings(), cli_select=["ALL"])


def _parses(data: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(data)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_package_sweep():
    """Every .py file of the installed torch package, all rules: no internal error and
    TL001 exactly where CPython's parser refuses the file."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    assert len(files) > 1000
    result = run(files, ALL, Settings(), jobs=2)
    assert result.errors == [], [str(e) for e in result.errors[:5]]
    tl001 = {f.path for f in result.findings if f.code == "TL001"}
    assert tl001 == {display_path(p) for p in files if not _parses(p.read_bytes())}


def _lint_and_fix(source: str) -> None:
    linter = Linter(ALL)

    def lint(text: str):
        r = linter.lint_bytes(text.encode("utf-8", "surrogatepass"), "fuzz.py", text=text)
        assert r.errors == [], r.errors
        return r.findings

    fixed, _, _ = fix_text(source, lint, unsafe=True)
    if _parses(source.encode("utf-8", "surrogatepass")):
        assert _parses(fixed.encode("utf-8", "surrogatepass")), "a fix broke the file"
    again, applied, _ = fix_text(fixed, lint, unsafe=True)
    assert again == fixed and applied == 0, "a second --fix changed the file"


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FIXTURE_TEXTS = [p.read_text(encoding="utf-8") for p in sorted(FIXTURES.rglob("*.py"))]


@st.composite
def mutated_fixtures(draw):
    """Realistic training code, damaged: lines dropped, duplicated, swapped, dedented."""
    text = draw(st.sampled_from(FIXTURE_TEXTS))
    lines = text.splitlines(keepends=True)
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    for _ in range(draw(st.integers(1, 8))):
        if not lines:
            break
        i = rnd.randrange(len(lines))
        op = rnd.choice(("drop", "dup", "swap", "dedent", "truncate"))
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = rnd.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "dedent":
            lines[i] = lines[i].lstrip(" ")
        else:
            lines[i] = lines[i][: rnd.randrange(len(lines[i]) + 1)]
    return "".join(lines)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated_fixtures())
def test_fuzz_mutated_training_code(source):
    _lint_and_fix(source)


hypothesmith = pytest.importorskip("hypothesmith")


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(hypothesmith.from_grammar())
def test_fuzz_generated_programs(source):
    _lint_and_fix(source)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(hypothesmith.from_node())
def test_fuzz_generated_syntax_trees(source):
    _lint_and_fix(source)


# -- hostile inputs ---------------------------------------------------------------------------


@pytest.fixture
def run_cli(run_cli):
    """The shared runner, with TL702 selected: it is opt-in, and its one-line finding is
    the one these tests look for."""

    def _run(*args, **kwargs):
        if args and args[0] == "check":
            args = ("check", "--extend-select", "TL702", *args[1:])
        return run_cli(*args, **kwargs)

    return _run


def test_50mb_file_is_reported_and_skipped(run_cli, tree):
    root = tree({"small.py": "import torch\nsd = torch.load(p)\n"})
    big = root / "generated.py"
    with big.open("w") as fh:
        line = "x_%d = [1, 2, 3]  # generated\n"
        for i in range(1_700_000):
            fh.write(line % i)
    assert big.stat().st_size > 50 * 1024 * 1024
    code, out, _ = run_cli("check", "--jobs", "1", "--no-cache", str(root))
    assert code == 1
    assert "generated.py:1:1: TL001" in out and "too large" in out
    assert "small.py:2:6: TL702" in out


def test_unreadable_file_is_reported(run_cli, tree, monkeypatch):
    root = tree({"a.py": "import torch\nsd = torch.load(p)\n", "secret.py": "x = 1\n"})
    real = Path.read_bytes

    def guarded(self):
        if self.name == "secret.py":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", guarded)
    code, out, _ = run_cli("check", "--jobs", "1", "--no-cache", str(root))
    assert "secret.py:1:1: TL001" in out and "cannot read file (not a syntax error)" in out
    assert "permission denied" in out
    assert "a.py:2:6: TL702" in out


def test_looping_symlinks_and_odd_names(run_cli, tree):
    root = tree({"ok.py": "import torch\nsd = torch.load(p)\n"})
    os.symlink("loop2.py", root / "loop1.py")
    os.symlink("loop1.py", root / "loop2.py")
    fd = os.open(os.fsencode(str(root)) + b"/odd\xffname.py", os.O_WRONLY | os.O_CREAT)
    os.write(fd, b"import torch\nsd = torch.load(p)\n")
    os.close(fd)
    code, out, err = run_cli("check", "--jobs", "1", "--no-cache", str(root))
    assert code == 1, err
    assert out.count("TL702") == 2
    assert "loop1.py:1:1: TL001" in out and "loop2.py:1:1: TL001" in out
    assert out.count("symbolic link loop") == 2


def test_stdin(tmp_path):
    src = b"import torch\nmodel.load_state_dict(torch.load(p))\n"
    proc = subprocess.run(
        [sys.executable, "-m", "trainlint", "check", "--extend-select", "TL702", "-"]
        + ["--stdin-filename", "train.py"],
        input=src,
        capture_output=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and b"train.py:2:23: TL702" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "trainlint", "check", "--extend-select", "TL702", "--fix", "-"],
        input=src,
        capture_output=True,
        cwd=tmp_path,
    )
    assert proc.stdout == b"import torch\nmodel.load_state_dict(torch.load(p, weights_only=True))\n"


def test_linter_never_executes_the_code(tmp_path, run_cli):
    marker = tmp_path / "executed"
    (tmp_path / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('x')\n"
        "import torch\nraise SystemExit(3)\n"
    )
    (tmp_path / "evil.ipynb").write_text(
        '{"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "source": '
        f'"open({str(marker)!r}, \\"w\\")"}}], "metadata": {{}}, "nbformat": 4, '
        '"nbformat_minor": 5}'
    )
    run_cli("check", "--no-cache", str(tmp_path))
    assert not marker.exists()


def test_no_pickle_anywhere_in_the_linter():
    src = Path(__file__).resolve().parent.parent / "src" / "trainlint"
    for path in src.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", "") or ""]
                assert not any(
                    n.split(".")[0] in ("pickle", "dill", "marshal", "shelve") for n in names
                ), path


_PARENT = os.getpid()


def _dying_work(path):
    """Kills any worker process it runs in (as the OOM killer would)."""
    import trainlint.workers as workers

    if os.getpid() != _PARENT:
        os._exit(1)
    return workers._real_work(path)  # type: ignore[attr-defined]


def test_broken_pool_is_redone_in_process(tree, monkeypatch):
    """A worker process that dies loses no file: the run falls back to in-process linting."""
    import trainlint.workers as workers

    root = tree({f"m{i}.py": "import torch\nsd = torch.load(p)\n" for i in range(6)})
    files = sorted(root.glob("*.py"))
    monkeypatch.setattr(workers, "_real_work", workers._work, raising=False)
    monkeypatch.setattr(workers, "_work", _dying_work)
    result = run(files, ALL, Settings(), jobs=2)
    assert len([f for f in result.findings if f.code == "TL702"]) == 6


def test_fix_on_every_fixture_is_idempotent_and_parses(tmp_path):
    for path in sorted(FIXTURES.rglob("*.py")):
        copy = tmp_path / path.name
        copy.write_bytes(path.read_bytes())
        settings = Settings()
        run([copy], ALL, settings, jobs=1, fix=FixMode(write=True, unsafe=True))
        once = copy.read_bytes()
        assert _parses(once), path
        run([copy], ALL, settings, jobs=1, fix=FixMode(write=True, unsafe=True))
        assert copy.read_bytes() == once, path


def test_concurrent_runs_share_a_cache_safely(tmp_path):
    """Two processes linting the same tree into one cache: same output, no damage."""
    files = {f"m{i}.py": f"import torch\nsd = torch.load(p{i})\n" for i in range(40)}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.trainlint]\ncache-dir = "shared-cache"\nextend-select = ["TL702"]\n'
    )
    cmd = [sys.executable, "-m", "trainlint", "check", "--jobs", "1", str(tmp_path)]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 1 for p in procs), [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1 and outs[0][0].count(b"TL702") == 40
    again = subprocess.run(cmd, capture_output=True, cwd=tmp_path)
    assert again.stdout == outs[0][0]
    assert not list((tmp_path / "shared-cache").rglob("*.tmp"))
