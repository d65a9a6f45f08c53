"""Each file is linted with its nearest configuration, whatever else the command line
names and in whatever order (issue 36, items 2, 3, 9, 23)."""

from __future__ import annotations

import json
import os

import pytest

LOAD = "import torch\nsd = torch.load(p)\n"  # TL702: off by default, on where selected


def _project(tree):
    return tree(
        {
            "pkg/pyproject.toml": '[tool.trainlint]\nselect = ["TL702"]\n',
            "pkg/t.py": LOAD,
            "pkg/sub/pyproject.toml": '[tool.trainlint]\nignore = ["TL702"]\n',
            "pkg/sub/t.py": LOAD,
        }
    )


def _codes(out: str) -> list[tuple[str, str]]:
    return sorted((f["path"], f["code"]) for f in json.loads(out))


def test_each_file_gets_its_nearest_config_in_either_order(run_cli, tree):
    root = _project(tree)
    a = run_cli(
        "check", "--no-cache", "--output-format", "json", "pkg/sub/t.py", "pkg/t.py", cwd=root
    )
    b = run_cli(
        "check", "--no-cache", "--output-format", "json", "pkg/t.py", "pkg/sub/t.py", cwd=root
    )
    assert a == b
    assert _codes(a[1]) == [("pkg/t.py", "TL702")]


def test_a_directory_walk_uses_the_nested_config(run_cli, tree):
    root = _project(tree)
    code, out, _ = run_cli("check", "--no-cache", "--output-format", "json", ".", cwd=root)
    assert _codes(out) == [("pkg/t.py", "TL702")] and code == 1
    # one file at a time (what a pre-commit batch may be) gives the same per file
    one = run_cli("check", "--no-cache", "--output-format", "json", "pkg/sub/t.py", cwd=root)
    assert _codes(one[1]) == [] and one[0] == 0


def test_config_flag_forces_one_config_for_every_file(run_cli, tree):
    root = _project(tree)
    code, out, _ = run_cli(
        "check", "--no-cache", "--config", "pkg/pyproject.toml", "--output-format", "json",
        "pkg/sub/t.py", "pkg/t.py", cwd=root,
    )  # fmt: skip
    assert _codes(out) == [("pkg/sub/t.py", "TL702"), ("pkg/t.py", "TL702")]


def test_cache_is_keyed_on_each_files_own_settings(run_cli, tree):
    root = _project(tree)
    first = run_cli("check", "--output-format", "json", "pkg/sub/t.py", "pkg/t.py", cwd=root)
    again = run_cli("check", "--output-format", "json", "pkg/t.py", "pkg/sub/t.py", cwd=root)
    assert first == again and _codes(again[1]) == [("pkg/t.py", "TL702")]


def test_nested_exclude_applies_under_its_own_directory(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint]\nselect = ["TL702"]\n',
            "a.py": LOAD,
            "sub/pyproject.toml": '[tool.trainlint]\nselect = ["TL702"]\nexclude = ["gen"]\n',
            "sub/gen/b.py": LOAD,
            "sub/c.py": LOAD,
        }
    )
    code, out, _ = run_cli("check", "--no-cache", "--output-format", "json", ".", cwd=root)
    assert _codes(out) == [("a.py", "TL702"), ("sub/c.py", "TL702")]


def test_force_exclude_skips_excluded_files_named_on_the_command_line(run_cli, tree):
    root = tree(
        {
            "pyproject.toml": '[tool.trainlint]\nselect = ["TL702"]\nexclude = ["generated"]\n',
            "generated/x.py": LOAD,
            "y.py": LOAD,
        }
    )
    code, out, _ = run_cli("check", "--no-cache", "generated/x.py", "y.py", cwd=root)
    assert "generated/x.py" in out  # named files are linted, as before
    code, out, _ = run_cli(
        "check", "--no-cache", "--force-exclude", "generated/x.py", "y.py", cwd=root
    )
    assert "generated/x.py" not in out and "y.py:2:6: TL702" in out and code == 1
    # every named file excluded: nothing to lint is not an error
    code, out, err = run_cli("check", "--no-cache", "--force-exclude", "generated/x.py", cwd=root)
    assert code == 0 and "TL702" not in out and "no Python files" in err


def test_force_exclude_with_stdin_echoes_the_buffer(run_cli, tree, monkeypatch):
    import io
    import sys

    root = tree({"pyproject.toml": '[tool.trainlint]\nselect = ["TL702"]\nexclude = ["gen"]\n'})
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LOAD.encode())))
    code, out, _ = run_cli(
        "check", "--force-exclude", "--stdin-filename", "gen/x.py", "-", cwd=root
    )
    assert code == 0 and out == ""


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlink_loop_as_first_path_is_not_a_crash(run_cli, tree):
    root = tree({"ok.py": LOAD})
    os.symlink("loop2.py", root / "loop1.py")
    os.symlink("loop1.py", root / "loop2.py")
    code, out, err = run_cli(
        "check", "--no-cache", "--select", "TL702", "loop1.py", "ok.py", cwd=root
    )
    assert "Traceback" not in err and "RuntimeError" not in err
    assert "ok.py:2:6: TL702" in out and code in (1, 2)
    from trainlint.config_tree import ConfigTree

    assert ConfigTree().config_of(root / "loop1.py") is None


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_a_symlink_to_a_file_in_the_same_tree_is_linted_once(run_cli, tree):
    root = tree({"src/train.py": LOAD})
    (root / "src" / "alias.py").symlink_to("train.py")
    code, out, _ = run_cli("check", "--no-cache", "--select", "TL702", "src", cwd=root)
    assert out.count("TL702") == 1 and "src/train.py:2:6" in out
