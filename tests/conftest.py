from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `trainlint ...` in-process; returns (exit code, stdout, stderr)."""
    from trainlint.cli import main

    def _run(*args: str, cwd: Path | None = None) -> tuple[int, str, str]:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return _run


@pytest.fixture
def tree(tmp_path):
    """Write a {relative path: text} mapping under tmp_path; returns tmp_path."""

    def _make(files: dict[str, str | bytes]) -> Path:
        for rel, content in files.items():
            p = tmp_path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                p.write_bytes(content)
            else:
                p.write_text(content, encoding="utf-8")
        return tmp_path

    return _make


os.environ.setdefault("TRAINLINT_TESTING", "1")
