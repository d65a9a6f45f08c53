"""The argument parser of the command line: ``trainlint check | rule | rules | debug``
and their options (what each command does is in :mod:`trainlint.cli`)."""

from __future__ import annotations

import argparse

from trainlint import __version__

FORMATS = ("concise", "full", "json", "json-lines", "sarif", "github", "gitlab", "junit")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainlint",
        description="Find the bugs that make PyTorch training fail silently.",
    )
    parser.add_argument("--version", action="version", version=f"trainlint {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = sub.add_parser("check", help="lint files, directories and notebooks")
    check.add_argument("paths", nargs="*", default=None, help='files or directories (default ".")')
    sel = check.add_argument_group("rule selection")
    sel.add_argument(
        "--select",
        action="append",
        metavar="CODES",
        help="codes or prefixes to enable (replaces the default set), e.g. TL1,TL301",
    )
    sel.add_argument(
        "--ignore", action="append", metavar="CODES", help="codes or prefixes to disable"
    )
    sel.add_argument(
        "--extend-select",
        action="append",
        metavar="CODES",
        help="codes or prefixes to enable in addition to the selection",
    )
    out = check.add_argument_group("output")
    out.add_argument(
        "--output-format",
        default=None,
        metavar="FORMAT",
        help=f"how findings are printed: {', '.join(FORMATS)} or one a plugin "
        "adds (default: concise)",
    )
    out.add_argument(
        "--show-source",
        action="store_true",
        help="show the offending source lines (same as --output-format full)",
    )
    out.add_argument("--statistics", action="store_true", help="print counts per rule instead")
    out.add_argument(
        "--output-file",
        "-o",
        metavar="PATH",
        help="write the report to PATH instead of stdout",
    )
    out.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour the findings: on a terminal (auto; NO_COLOR turns it off), always, never",
    )
    out.add_argument("--quiet", "-q", action="store_true", help="print findings only, no summary")
    out.add_argument("--exit-zero", action="store_true", help="exit 0 even when findings remain")
    fixes = check.add_argument_group("fixes")
    fixes.add_argument(
        "--fix",
        action="store_true",
        help="apply safe fixes in place (atomically), then report what is left",
    )
    fixes.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="also apply (with --fix/--diff) fixes marked unsafe",
    )
    fixes.add_argument(
        "--diff", action="store_true", help="print the fixes as a unified diff and write nothing"
    )
    fixes.add_argument(
        "--fix-only",
        action="store_true",
        help="apply fixes, report nothing else; exit 0 unless an error (implies --fix)",
    )
    fixes.add_argument(
        "--show-fixes", action="store_true", help="list the files fixed and how many fixes each"
    )
    fixes.add_argument(
        "--add-noqa",
        action="store_true",
        help="add a `# noqa: CODE` comment for every finding, and exit 0",
    )
    fixes.add_argument(
        "--exit-non-zero-on-fix",
        action="store_true",
        help="exit 1 when a fix was applied, even if no finding remains",
    )
    out.add_argument(
        "--timings", action="store_true", help="print the time spent in each rule (to stderr)"
    )
    files = check.add_argument_group("files")
    files.add_argument(
        "--config", metavar="PATH", help="config file (pyproject.toml or trainlint.toml)"
    )
    files.add_argument(
        "--exclude",
        action="append",
        metavar="PATTERNS",
        help="glob patterns to skip (replaces the configured `exclude`)",
    )
    files.add_argument(
        "--extend-exclude",
        action="append",
        metavar="PATTERNS",
        help="glob patterns to skip in addition",
    )
    files.add_argument(
        "--force-exclude",
        action="store_true",
        help="apply `exclude` to files named on the command line too (for pre-commit)",
    )
    files.add_argument(
        "--target-torch",
        metavar="VERSION",
        help='the oldest torch the code runs on, e.g. "2.6" (overrides `target-torch`)',
    )
    files.add_argument(
        "--show-files", action="store_true", help="list the files that would be linted, and exit"
    )
    files.add_argument(
        "--show-settings",
        action="store_true",
        help="print (as JSON) the settings each config gives its files, and exit",
    )
    files.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        metavar="N",
        help="worker processes (default: all cores)",
    )
    files.add_argument(
        "--stdin-filename",
        metavar="PATH",
        help="with `-` as the path: the name to report (and match config by)",
    )
    files.add_argument(
        "--no-cache", action="store_true", help="do not read or write the content-hash cache"
    )

    rule = sub.add_parser("rule", help="explain one rule")
    rule.add_argument("code", help="rule code, e.g. TL301, or its name")
    rules = sub.add_parser("rules", help="list all rules")
    rules.add_argument(
        "--output-format", choices=("text", "json"), default="text", help="table or JSON"
    )
    clean = sub.add_parser("clean", help="remove the cache of the configs governing PATHS")
    clean.add_argument("paths", nargs="*", help='files or directories (default ".")')
    clean.add_argument("--config", metavar="PATH", help="config file to take `cache-dir` from")
    debug = sub.add_parser("debug", help="show what the analysis sees in a file")
    debug_sub = debug.add_subparsers(dest="debug_command", metavar="VIEW", required=True)
    debug_model = debug_sub.add_parser(
        "model", help="print the step model: loops, events in order, guards, roles"
    )
    debug_model.add_argument("file", help="a Python file or a notebook")
    return parser
