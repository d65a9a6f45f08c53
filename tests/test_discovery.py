"""Which files get linted: gitignore, virtualenvs, build dirs, explicit files."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from trainlint.config import Settings
from trainlint.discovery import discover

SRC = "import torch\n"


def names(paths, root):
    return sorted(p.relative_to(root).as_posix() for p in paths)


def test_default_skips(tree):
    root = tree(
        {
            "a.py": SRC,
            "b.pyi": SRC,
            "c.ipynb": "{}",
            "notes.txt": "x",
            ".venv/lib/x.py": SRC,
            "myenv/pyvenv.cfg": "",
            "myenv/lib/y.py": SRC,
            "build/z.py": SRC,
            "dist/z.py": SRC,
            "__pycache__/z.py": SRC,
            "node_modules/z.py": SRC,
            ".git/hooks/z.py": SRC,
            "pkg/sub/d.py": SRC,
            "pkg.egg-info/e.py": SRC,
        }
    )
    got = names(discover([root], Settings(root=root)), root)
    assert got == ["a.py", "b.pyi", "c.ipynb", "pkg/sub/d.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_gitignore_honoured(tree):
    root = tree(
        {
            ".gitignore": "generated/\n*_pb2.py\n",
            "a.py": SRC,
            "generated/g.py": SRC,
            "proto_pb2.py": SRC,
            "sub/b.py": SRC,
        }
    )
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    got = names(discover([root], Settings(root=root)), root)
    assert got == ["a.py", "sub/b.py"]
    # explicitly named files are always linted
    got = names(discover([root / "proto_pb2.py"], Settings(root=root)), root)
    assert got == ["proto_pb2.py"]
    # a subdirectory of the repository honours the root's .gitignore too
    (root / "sub" / "x_pb2.py").write_text(SRC)
    got = names(discover([root / "sub"], Settings(root=root)), root)
    assert got == ["sub/b.py"]


def test_explicit_files_and_dedupe(tree):
    root = tree({"a.py": SRC, "b.txt": "not python"})
    files = list(discover([root / "a.py", root / "a.py", root], Settings(root=root)))
    assert names(files, root) == ["a.py"]
    assert names(discover([root / "b.txt"], Settings(root=root)), root) == ["b.txt"]


def test_excludes(tree):
    root = tree({"a.py": SRC, "gen/b.py": SRC, "x/gen_c.py": SRC})
    s = Settings(root=root, exclude=["gen"], extend_exclude=["x/gen_*.py"])
    assert names(discover([root], s), root) == ["a.py"]


def test_broken_symlink_is_reported_not_fatal(run_cli, tree):
    root = tree({"a.py": SRC})
    (root / "dangling.py").symlink_to(root / "missing.py")
    code, out, _ = run_cli("check", str(root))
    assert code == 1 and "dangling.py:1:1: TL001" in out and "cannot read" in out
    assert "dangling symbolic link (to " in out and "missing.py" in out


def test_directory_named_like_file(run_cli, tree):
    root = tree({"pkg.py/inner.py": SRC})
    code, out, _ = run_cli("check", str(root / "pkg.py"))
    assert code == 0
