"""The command line as a new user meets it (issue 36): errors are one line with exit 2,
nothing is linted before a bad option is rejected, every output mode honours its flags,
and the flags ruff users reach for exist."""

from __future__ import annotations

import io
import json
import sys

import pytest

LOAD = "import torch\nsd = torch.load(p)\n"  # TL702, unsafe fix
LEAK = (
    "import torch\n"
    "for x in loader:\n"
    "    loss = model(x).sum()\n"
    "    opt.zero_grad()\n"
    "    loss.backward(retain_graph=True)\n"
    "    opt.step()\n"
)  # TL301, unsafe fix


@pytest.fixture
def run_cli(run_cli):
    """The shared runner, with TL702 selected: it is opt-in, and `LOAD` is its finding."""

    def _run(*args, **kwargs):
        if args and args[0] == "check":
            args = ("check", "--extend-select", "TL702", *args[1:])
        return run_cli(*args, **kwargs)

    return _run


@pytest.fixture
def stdin(monkeypatch):
    def _feed(text: str) -> None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))

    return _feed


def test_stdin_with_an_unknown_format_is_one_line_exit_2(run_cli, stdin):
    stdin(LOAD)
    code, out, err = run_cli("check", "--output-format", "nope", "-")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "unknown --output-format `nope`" in err


def test_stdin_takes_a_plugins_format(run_cli, tree, stdin):
    from trainlint.plugins import manager

    root = tree(
        {
            "fmtplugin.py": (
                "from trainlint.plugins.hookspecs import hookimpl\n\n"
                "@hookimpl\n"
                "def trainlint_output_formats():\n"
                "    return {'count': lambda findings, rules: f'{len(findings)} found\\n'}\n"
            ),
            "pyproject.toml": '[tool.trainlint]\nplugins = ["fmtplugin"]\n',
        }
    )
    manager._manager.cache_clear()
    try:
        stdin(LOAD)
        code, out, err = run_cli(
            "check", "--output-format", "count", "--stdin-filename", "t.py", "-", cwd=root
        )
    finally:
        manager._manager.cache_clear()
        sys.modules.pop("fmtplugin", None)
        if str(root) in sys.path:
            sys.path.remove(str(root))
    assert out == "1 found\n" and code == 1, err


def test_an_unknown_format_is_rejected_before_linting(run_cli, tree, monkeypatch):
    import trainlint.runner

    def never(*args, **kwargs):
        raise AssertionError("linted before the format was checked")

    monkeypatch.setattr(trainlint.runner, "run", never)
    root = tree({"a.py": LOAD})
    code, _, err = run_cli("check", "--output-format", "nope", str(root))
    assert code == 2 and "unknown --output-format" in err


def test_an_internal_error_exits_2_with_one_line(run_cli, tree, monkeypatch):
    import trainlint.check_command

    def boom(*args, **kwargs):
        raise RuntimeError("something we did not expect")

    monkeypatch.delenv("TRAINLINT_TRACEBACK", raising=False)
    monkeypatch.setattr(trainlint.check_command, "merge", boom)
    root = tree({"a.py": LOAD})
    code, _, err = run_cli("check", "--no-cache", str(root))
    assert code == 2
    assert err.count("\n") == 1 and "internal error: RuntimeError: something" in err


def test_statistics_in_json_and_from_stdin(run_cli, tree, stdin):
    root = tree({"a.py": LOAD})
    code, out, _ = run_cli(
        "check", "--no-cache", "--statistics", "--output-format", "json", "a.py", cwd=root
    )
    assert json.loads(out) == [
        {"code": "TL702", "name": "unsafe-torch-load", "count": 1, "fixable": 1}
    ]
    stdin(LOAD)
    code, out, _ = run_cli("check", "--statistics", "-")
    assert out.split() == ["1", "TL702", "unsafe-torch-load"] and code == 1


def test_diff_says_when_it_hides_unsafe_fixes(run_cli, tree):
    root = tree({"a.py": LEAK})
    code, out, err = run_cli("check", "--no-cache", "--diff", "a.py", cwd=root)
    assert out == "" and "1 unsafe fix not shown: add `--unsafe-fixes`" in err


def test_a_fix_run_does_not_suggest_its_own_flags(run_cli, tree, monkeypatch):
    import trainlint.fix

    monkeypatch.setattr(trainlint.fix, "_LIBCST", False)  # as without the fix extra
    root = tree(
        {
            "a.py": (
                "import torch\nfor x in loader:\n    loss = model(x).sum()\n"
                "    loss.backward()\n    opt.zero_grad()\n    opt.step()\n"
            )
        }
    )
    code, out, err = run_cli("check", "--no-cache", "--fix", "--unsafe-fixes", "a.py", cwd=root)
    assert code == 2 and "trainlint[fix]" in err
    assert "fixable with `--fix" not in out


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 parses it")
def test_newer_python_syntax_names_the_python_it_needs(run_cli, tree):
    root = tree(
        {"a.py": "type Batch = list[int]\n", "b.py": "def f[T](x: T) -> T:\n    return x\n"}
    )
    code, out, _ = run_cli("check", "--no-cache", ".", cwd=root)
    assert out.count("Python 3.12 syntax") == 2 and code == 1


def test_no_file_to_lint_is_a_warning(run_cli, tree):
    root = tree({"notes.txt": "x"})
    code, out, err = run_cli("check", "--no-cache", str(root))
    assert code == 0 and "no Python files" in err


def test_rules_lists_descriptions_and_confirming_checks_and_json(run_cli):
    code, out, _ = run_cli("rules")
    header = out.splitlines()[0].split()
    assert header[:5] == ["CODE", "NAME", "DEFAULT", "FIX", "SEVERITY"]
    assert "CONFIRMED" in header and "DESCRIPTION" in header
    code, out, _ = run_cli("rules", "--output-format", "json")
    rules = {r["code"]: r for r in json.loads(out)}
    assert rules["TL301"]["confirmed_by"] == "assert_memory_stable"
    assert rules["TL301"]["description"] and rules["TL301"]["default"] == "on"


# -- item 37: the flags ruff users reach for -------------------------------------------------


def test_output_file_show_files_and_show_settings(run_cli, tree):
    root = tree({"pyproject.toml": '[tool.trainlint]\nselect = ["TL702"]\n', "a.py": LOAD})
    code, out, _ = run_cli("check", "--no-cache", "--output-file", "out/report.txt", ".", cwd=root)
    assert code == 1 and out == ""
    assert "a.py:2:6: TL702" in (root / "out" / "report.txt").read_text()
    code, out, _ = run_cli("check", "--show-files", ".", cwd=root)
    assert out.split() == ["a.py"] and code == 0
    code, out, _ = run_cli("check", "--show-settings", ".", cwd=root)
    (shown,) = json.loads(out)
    assert shown["select"] == ["TL702"] and shown["files"] == ["a.py"]


def test_fix_only_and_exit_non_zero_on_fix(run_cli, tree):
    root = tree({"a.py": "import torch\nmodel.load_state_dict(torch.load(p))\n"})
    code, out, _ = run_cli(
        "check", "--no-cache", "--fix-only", "--exit-non-zero-on-fix", "a.py", cwd=root
    )
    assert code == 1 and "weights_only=True" in (root / "a.py").read_text()
    assert "TL702" not in out
    (root / "b.py").write_text("import torch\nmodel.load_state_dict(torch.load(p))\n")
    code, _, _ = run_cli("check", "--no-cache", "--fix-only", "b.py", cwd=root)
    assert code == 0


def test_target_torch_flag_and_environment_format(run_cli, tree, monkeypatch):
    root = tree({"a.py": "import torch\nsd = torch.load(p)\n"})
    code, out, _ = run_cli("check", "--no-cache", "--target-torch", "2.6", "a.py", cwd=root)
    assert "TL702" not in out  # a bare torch.load is safe from torch 2.6 on
    monkeypatch.setenv("TRAINLINT_OUTPUT_FORMAT", "json")
    code, out, _ = run_cli("check", "--no-cache", "--target-torch", "2.1", "a.py", cwd=root)
    assert json.loads(out)[0]["code"] == "TL702"
    code, _, err = run_cli("check", "--target-torch", "two", "a.py", cwd=root)
    assert code == 2 and "--target-torch" in err


@pytest.mark.parametrize("fmt", ["json-lines", "gitlab", "junit"])
def test_ci_formats(run_cli, tree, fmt):
    root = tree({"a.py": LOAD})
    code, out, _ = run_cli("check", "--no-cache", "--output-format", fmt, "a.py", cwd=root)
    assert code == 1 and "TL702" in out
    if fmt == "json-lines":
        assert json.loads(out.splitlines()[0])["line"] == 2
    elif fmt == "gitlab":
        assert json.loads(out)[0]["location"] == {"path": "a.py", "lines": {"begin": 2, "end": 2}}
    else:
        import xml.etree.ElementTree as ET

        assert ET.fromstring(out).find("testsuite/testcase/failure") is not None


def test_clean_removes_only_the_cache(run_cli, tree):
    root = tree({"pyproject.toml": '[tool.trainlint]\ncache-dir = "."\n', "a.py": LOAD})
    code, out, _ = run_cli("clean", ".", cwd=root)
    assert (root / "a.py").exists() and "No cache" in out  # not a directory it made
    (root / "pyproject.toml").write_text("[tool.trainlint]\n")
    run_cli("check", ".", cwd=root)
    assert (root / ".trainlint_cache").is_dir()
    code, out, _ = run_cli("clean", ".", cwd=root)
    assert code == 0 and not (root / ".trainlint_cache").exists()


def test_every_check_flag_is_documented():
    """Item 37: the flags exist and the getting-started page lists each one."""
    from pathlib import Path

    from trainlint.cli_parser import build_parser

    doc = (Path(__file__).resolve().parent.parent / "docs" / "getting-started.md").read_text()
    parser = build_parser()
    check = parser._subparsers._group_actions[0].choices["check"]  # type: ignore[union-attr]
    flags = {o for a in check._actions for o in a.option_strings if o.startswith("--")}
    assert flags >= {"--output-file", "--show-files", "--show-settings", "--force-exclude",
                     "--fix-only", "--exit-non-zero-on-fix", "--target-torch"}  # fmt: skip
    missing = sorted(f for f in flags - {"--help"} if f"`{f}" not in doc)
    assert missing == []


def test_add_noqa_suppresses_every_finding_and_only_where_a_line_ends(run_cli, tree):
    root = tree(
        {
            "a.py": (
                "import torch\n"
                "sd = torch.load(p)\n"
                "sd2 = torch.load(q)  # noqa: E501\n"
                'doc = torch.load(r), """\n'
                'text"""\n'
            )
        }
    )
    code, _, err = run_cli(
        "check", "--no-cache", "--select", "TL702", "--add-noqa", "a.py", cwd=root
    )
    # line 4 ends inside a string: a comment there would change the string, and one on
    # line 5 would not suppress the finding; it is left to the user
    assert code == 0 and "for 2 findings" in err
    assert (root / "a.py").read_text() == (
        "import torch\n"
        "sd = torch.load(p)  # noqa: TL702\n"
        "sd2 = torch.load(q)  # noqa: E501, TL702\n"
        'doc = torch.load(r), """\n'
        'text"""\n'
    )
    code, out, _ = run_cli("check", "--no-cache", "--select", "TL702", "a.py", cwd=root)
    assert out.count("TL702") == 1 and "a.py:4:" in out


def test_show_fixes_lists_the_files_fixed(run_cli, tree):
    root = tree({"a.py": "import torch\nmodel.load_state_dict(torch.load(p))\n", "b.py": "x = 1\n"})
    code, out, _ = run_cli("check", "--no-cache", "--fix", "--show-fixes", ".", cwd=root)
    assert "Fixed 1 finding." in out and "  a.py: 1 fix\n" in out and "b.py" not in out


def test_color_always_never_and_no_color(run_cli, tree, monkeypatch):
    root = tree({"a.py": LOAD})
    _, out, _ = run_cli("check", "--no-cache", "--color", "always", "a.py", cwd=root)
    assert "\x1b[1;31mTL702\x1b[0m" in out
    _, out, _ = run_cli("check", "--no-cache", "a.py", cwd=root)  # not a terminal
    assert "\x1b[" not in out
    from trainlint.reporting.text import wants_color

    class Tty:
        def isatty(self):
            return True

    assert wants_color("auto", Tty())
    monkeypatch.setenv("NO_COLOR", "1")
    assert not wants_color("auto", Tty())
