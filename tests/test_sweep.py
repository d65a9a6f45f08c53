"""Never crash on real code: the whole standard library through every rule.

TL001 must appear exactly on the files CPython's own parser rejects, and no rule may
raise an internal error. (The torch-package sweep lives in the reliability suite.)
"""

from __future__ import annotations

import ast
import sysconfig
import warnings
from pathlib import Path

import pytest

from trainlint.config import Settings, select_rules
from trainlint.rules import builtin_rules
from trainlint.runner import run

pytestmark = pytest.mark.slow


def _parses(path: Path) -> bool:
    data = path.read_bytes()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ast.parse(data)
        return True
    except SyntaxError as exc:
        # a coding cookie naming a codec this interpreter lacks: trainlint reads UTF-8
        # bytes as UTF-8 (as ruff does; the codec is usually a source transformer's)
        if not str(exc.msg).startswith("unknown encoding"):
            return False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ast.parse(data.decode("utf-8-sig"))
            return True
        except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, MemoryError):
            return False
    except (ValueError, RecursionError, MemoryError):
        return False


def test_stdlib_sweep():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p
        for p in stdlib.rglob("*.py")
        if "site-packages" not in p.parts and "dist-packages" not in p.parts and p.is_file()
    )
    assert len(files) > 500
    settings = Settings()
    selection = select_rules(builtin_rules(), settings, cli_select=["ALL"])
    result = run(files, selection, settings, jobs=2)
    assert result.errors == [], result.errors[:5]
    tl001 = {f.path for f in result.findings if f.code == "TL001"}
    from trainlint.runner import display_path

    rejected = {display_path(p) for p in files if not _parses(p)}
    assert tl001 == rejected
