"""``trainlint check -``: lint standard input (an editor's buffer) as the file named by
``--stdin-filename``, with that file's configuration; and ``--show-settings``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trainlint.check_command import (
    config_tree,
    formats_for,
    missing_libcst,
    output_format,
    selection_of,
    statistics,
)
from trainlint.config import per_file_ignored
from trainlint.settings import Settings


def check_stdin(args: argparse.Namespace) -> int:
    """Lint source from standard input; with --fix, write the fixed source to stdout."""
    from trainlint.engine import Linter
    from trainlint.fix import fix_text
    from trainlint.source import SourceError, decode

    name = args.stdin_filename or "-"
    tree = config_tree(args)
    settings = tree.settings_for(Path(name) if args.stdin_filename else Path.cwd())
    fmt = output_format(args)
    formats = formats_for(fmt, [settings])  # an unknown format: exit 2 before reading
    rules, selection = selection_of(args, settings)
    data = sys.stdin.buffer.read()
    if args.stdin_filename and args.force_exclude and excluded(Path(name), settings):
        if args.fix or args.fix_only:
            sys.stdout.buffer.write(data)  # an editor replaces its buffer with this
        return 0
    linter = Linter(selection)
    ignored = per_file_ignored(settings, Path(name)) if args.stdin_filename else set()
    if name.endswith(".ipynb"):
        if args.fix or args.fix_only or args.diff:
            from trainlint.config import ConfigError

            raise ConfigError("fixing a notebook read from standard input is not supported")
        from trainlint.notebook import lint_notebook

        result = lint_notebook(linter, data, name, ignored)
    else:
        result = linter.lint_bytes(data, name, ignored=ignored)
    if args.fix or args.fix_only or args.diff:
        try:
            text, _ = decode(data)
        except SourceError:
            text = None
        if text is not None:
            fixed, _, remaining = fix_text(
                text,
                lambda t: (
                    linter.lint_bytes(t.encode("utf-8"), name, ignored=ignored, text=t).findings
                ),
                args.unsafe_fixes,
            )
            if not args.diff:
                sys.stdout.write(fixed)
                if missing_libcst(remaining, args):
                    return 2
                if args.exit_non_zero_on_fix and fixed != text:
                    return 1
                return 1 if remaining and not (args.exit_zero or args.fix_only) else 0
            from trainlint.fix import unified_diff

            sys.stdout.write(unified_diff(name, text, fixed))
            if missing_libcst(remaining, args):
                return 2
            return 1 if fixed != text and not args.exit_zero else 0
    if args.statistics:
        sys.stdout.write(statistics(result.findings, fmt))
    else:
        formatter = formats[fmt]
        if formatter.__module__ != "trainlint.reporting":
            from trainlint.rules import real_rule

            rules = [real_rule(r) for r in rules]
        sys.stdout.write(formatter(result.findings, rules))
    for err in result.errors:
        print(f"trainlint: error: {err}", file=sys.stderr)
    if result.errors:
        return 2
    return 1 if result.findings and not args.exit_zero else 0


def excluded(path: Path, settings: Settings) -> bool:
    from trainlint.discovery import is_excluded

    return is_excluded(path, settings)


def show_settings(
    args: argparse.Namespace, groups: list[tuple[Settings, list[Path]]], shown: list[Settings]
) -> int:
    """``--show-settings``: each config the run uses, what it selects, and its files."""
    import json

    out: list[dict[str, Any]] = []
    for settings in shown:
        files = next((fs for s, fs in groups if s is settings), [])
        _, selection = selection_of(args, settings)
        out.append(
            {
                "config": str(settings.config_path) if settings.config_path else None,
                "root": str(settings.root),
                "select": sorted(selection.codes),
                "options": selection.options,
                "exclude": [*settings.exclude, *settings.extend_exclude],
                "per-file-ignores": settings.per_file_ignores,
                "target-torch": settings.target_torch,
                "plugins": settings.plugins,
                "files": [f.as_posix() for f in files],
            }
        )
    print(json.dumps(out, indent=2, default=str))
    return 0
