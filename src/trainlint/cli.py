"""The command line: what ``trainlint check | rule | rules | debug`` do, and ``main``
(the options they take are declared in :mod:`trainlint.cli_parser`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from trainlint.check_command import cmd_check, code_fingerprint
from trainlint.cli_parser import build_parser
from trainlint.config import ConfigError, Settings
from trainlint.rules.base import Rule

__all__ = ["cmd_check", "code_fingerprint", "main"]


def cmd_debug_model(path: str) -> int:
    """Print the step model of one file (what every rule reads) as stable text."""
    from trainlint.analysis.debug import describe
    from trainlint.analysis.model import FileModel
    from trainlint.source import Source, SourceError, decode, parse

    try:
        data = Path(path).read_bytes()
        if path.endswith(".ipynb"):
            from trainlint.notebook import notebook_module

            text = notebook_module(data)  # its code cells, as the linter reads them
        else:
            text, _ = decode(data)
        tree = parse(text, path)
    except OSError as exc:
        print(f"trainlint: error: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except (SourceError, ValueError) as exc:
        where = f"{path}:{exc.line}:{exc.column}" if isinstance(exc, SourceError) else path
        message = exc.message if isinstance(exc, SourceError) else f"not a valid notebook: {exc}"
        print(f"trainlint: error: {where}: {message}", file=sys.stderr)
        return 1
    from trainlint.analysis.project import apply_view, view_of_file

    model = FileModel(tree, Source(text), path)
    if path.endswith(".py"):
        apply_view(model, view_of_file(path, tree))  # what the files it imports do
    sys.stdout.write(describe(model, Path(path).as_posix()))
    return 0


def _load_settings(args: argparse.Namespace, paths: list[Path]) -> Settings:
    from trainlint.check_command import config_tree

    return config_tree(args).settings_for(paths[0] if paths else Path.cwd())


def cmd_rules(rules: Sequence[type[Rule]], fmt: str = "text") -> int:
    """Every rule: code, name, default, fix, severity, the runtime check that confirms it,
    and what it reports; ``fmt="json"``: the same as a list of objects."""
    items = [
        {
            "code": r.code,
            "name": r.name,
            "default": "on" if r.default_enabled else "off",
            "fix": r.fix_safety or "-",
            "severity": r.severity,
            "confirmed_by": r.confirm_with or "-",
            # a message's placeholders (filled in per finding) read as <name>
            "description": re.sub(r"\{(\w*)[^}]*\}", r"<\1>", r.message),
        }
        for r in rules
    ]
    if fmt == "json":
        import json

        print(json.dumps(items, indent=2))
        return 0
    header = {k: k.upper().replace("_", " ") for k in items[0]} if items else {}
    rows = [list(header.values())] + [list(item.values()) for item in items]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if items else []
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def cmd_rule(rules: Sequence[type[Rule]], code: str) -> int:
    wanted = code.strip()
    for r in rules:
        if r.code == wanted.upper() or r.name == wanted.lower():
            print(r.documentation(), end="")
            return 0
    print(f"trainlint: error: unknown rule `{code}` (see `trainlint rules`)", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # a file name that is not valid UTF-8, a terminal that is not UTF-8: never crash
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        if args.command == "check":
            return cmd_check(args)
        if args.command == "debug":
            return cmd_debug_model(args.file)
        if args.command == "clean":
            return cmd_clean(args)
        from trainlint.api import all_rules

        settings = _load_settings(args, [Path.cwd()])
        rules = all_rules(settings)
        if args.command == "rules":
            return cmd_rules(rules, args.output_format)
        return cmd_rule(rules, args.code)
    except ConfigError as exc:
        print(f"trainlint: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except BrokenPipeError:
        # `trainlint check | head`: the reader left. Python's own recipe: point stdout at
        # devnull so the interpreter's final flush cannot raise again, and exit non-zero.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:
        # A bug of ours, not a finding: exit 2 (1 means "findings remain", and a CI job
        # must not read a crash as that), one line, and TRAINLINT_TRACEBACK=1 for the rest.
        if os.environ.get("TRAINLINT_TRACEBACK"):
            raise
        print(
            f"trainlint: internal error: {type(exc).__name__}: {exc} (please report it; "
            "TRAINLINT_TRACEBACK=1 shows where)",
            file=sys.stderr,
        )
        return 2


def cmd_clean(args: argparse.Namespace) -> int:
    """Remove the cache directories of the configs that govern the given paths."""
    import shutil

    from trainlint.check_command import cache_directory, config_tree

    tree = config_tree(args)
    removed = 0
    for raw in args.paths or ["."]:
        directory = cache_directory(tree.settings_for(Path(raw)))
        marker = directory / ".gitignore"
        # only a directory the cache made (it leaves this marker): `cache-dir = "."` must
        # not remove a project
        if marker.is_file() and marker.read_text(errors="replace").startswith(
            "# created by trainlint"
        ):
            shutil.rmtree(directory)
            removed += 1
            print(f"Removed {directory}")
    if not removed:
        print("No cache to remove.")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
