"""The command line: what ``trainlint check | rule | rules | debug`` do, and ``main``
(the options they take are declared in :mod:`trainlint.cli_parser`)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trainlint.cli_parser import build_parser
from trainlint.config import (
    ConfigError,
    RuleSelection,
    Settings,
    find_config,
    load_config,
    select_rules,
)
from trainlint.rules.base import Rule

if TYPE_CHECKING:
    from trainlint.cache import Cache
    from trainlint.findings import Finding
    from trainlint.runner import RunResult


def _selectors(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    out: list[str] = []
    for v in values:
        out.extend(s.strip().upper() for s in v.split(",") if s.strip())
    return out


def _patterns(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def cmd_debug_model(path: str) -> int:
    """Print the step model of one file (what every rule reads) as stable text."""
    from trainlint.analysis.debug import describe
    from trainlint.analysis.model import FileModel
    from trainlint.source import Source, SourceError, decode, parse

    try:
        text, _ = decode(Path(path).read_bytes())
        tree = parse(text, path)
    except OSError as exc:
        print(f"trainlint: error: {path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except SourceError as exc:
        print(f"trainlint: error: {path}:{exc.line}:{exc.column}: {exc.message}", file=sys.stderr)
        return 1
    from trainlint.analysis.effects import view_of_file
    from trainlint.analysis.project import apply_view

    model = FileModel(tree, Source(text), path)
    if path.endswith(".py"):
        apply_view(model, view_of_file(path, tree))  # what the files it imports do
    sys.stdout.write(describe(model, Path(path).as_posix()))
    return 0


def _load_settings(args: argparse.Namespace, paths: list[Path]) -> Settings:
    if getattr(args, "config", None):
        cfg = Path(args.config)
        if not cfg.is_file():
            raise ConfigError(f"{cfg}: config file not found")
        return load_config(cfg)
    found = find_config(paths[0] if paths else Path.cwd())
    return load_config(found) if found else Settings()


def cmd_rules(rules: Sequence[type[Rule]]) -> int:
    rows = [("CODE", "NAME", "DEFAULT", "FIX", "SEVERITY")]
    for r in rules:
        rows.append(
            (r.code, r.name, "on" if r.default_enabled else "off", r.fix_safety or "-", r.severity)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
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


def cmd_check(args: argparse.Namespace) -> int:
    from trainlint.api import all_rules
    from trainlint.discovery import DiscoveryError, discover
    from trainlint.reporting import builtin_formats
    from trainlint.runner import FixMode, run

    if args.paths == ["-"]:
        return _check_stdin(args)
    paths = [Path(p) for p in (args.paths or ["."])]
    settings = _load_settings(args, paths)
    if args.exclude is not None:
        settings.exclude = _patterns(args.exclude) or []
    if args.extend_exclude is not None:
        settings.extend_exclude += _patterns(args.extend_exclude) or []
    # the catalog's stand-ins import each rule when it first runs; --timings times the
    # rules' checks, not their imports
    rules = all_rules(settings, catalog=not args.timings)
    selection = select_rules(
        rules,
        settings,
        cli_select=_selectors(args.select),
        cli_ignore=_selectors(args.ignore),
        cli_extend_select=_selectors(args.extend_select),
    )
    if args.jobs is not None and args.jobs < 0:
        raise ConfigError("--jobs must be >= 0")
    try:
        files = list(discover(paths, settings))
    except DiscoveryError as exc:
        raise ConfigError(str(exc)) from None
    fix = FixMode(write=args.fix and not args.diff, diff=args.diff, unsafe=args.unsafe_fixes)
    cache = None if args.no_cache or args.timings else _make_cache(settings, selection, rules)
    result = run(
        files,
        selection,
        settings,
        jobs=args.jobs or settings.jobs,
        timings=args.timings,
        fix=fix if fix.active else None,
        cache=cache,
    )
    if args.diff:
        for diff in result.diffs:
            sys.stdout.write(diff)
        if not args.quiet:
            left = len(result.findings)
            rest = (
                f"; {_count(left, 'finding')} would remain (run without `--diff` to list "
                "them; they do not change the exit status)"
                if left
                else ""
            )
            print(f"Would fix {_count(result.fixed, 'finding')}{rest}.", file=sys.stderr)
        for err in result.errors:
            print(f"trainlint: error: {err}", file=sys.stderr)
        if result.errors or _missing_libcst(result.findings, args):
            return 2
        return 1 if result.diffs and not args.exit_zero else 0
    fmt = args.output_format or ("full" if args.show_source else "concise")
    own = builtin_formats()
    from trainlint.plugins.manager import load_formats

    formats = {**own, **load_formats(settings.plugins)}
    if fmt not in formats:
        raise ConfigError(f"unknown --output-format `{fmt}` (choose from {', '.join(formats)})")
    if args.statistics:
        counts = Counter((f.code, f.name) for f in result.findings)
        for (code, name), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"{n:>5}  {code}  {name}")
        if not args.quiet:
            _print_summary(result, args)
    else:
        if formats[fmt] is not own.get(fmt):
            # a plugin's format is handed the rule classes themselves (ours read only the
            # metadata and documentation that the catalog's stand-ins have)
            from trainlint.rules import real_rule

            rules = [real_rule(r) for r in rules]
        sys.stdout.write(formats[fmt](result.findings, rules))
        if fmt in ("concise", "full") and not args.quiet:
            _print_summary(result, args)
    for err in result.errors:
        print(f"trainlint: error: {err}", file=sys.stderr)
    if args.timings:
        for code, secs in sorted(result.timings.items(), key=lambda kv: -kv[1]):
            print(f"{secs * 1000:10.1f} ms  {code}", file=sys.stderr)
    if result.errors or (fix.active and _missing_libcst(result.findings, args)):
        return 2
    if args.exit_zero:
        return 0
    return result.exit_code


def _missing_libcst(findings: list[Finding], args: argparse.Namespace) -> bool:
    """A fix that moves statements was asked for and libcst is not installed: say what
    to install (one line, on stderr); the text-only fixes were applied all the same."""
    from trainlint.fix import MISSING_LIBCST, needs_libcst

    if needs_libcst(findings, args.unsafe_fixes):
        print(MISSING_LIBCST, file=sys.stderr)
        return True
    return False


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _print_summary(result: RunResult, args: argparse.Namespace) -> None:
    """The closing lines: what was fixed, found (in how many of the files checked), fixable."""
    n = len(result.findings)
    if result.fixed:
        print(f"Fixed {_count(result.fixed, 'finding')}.")
    if not n:
        print(f"All checks passed ({_count(result.files, 'file')}).")
        return
    print(
        f"Found {_count(n, 'finding')} in {result.files_with_findings} of "
        f"{_count(result.files, 'file')}."
    )
    safe = sum(1 for f in result.findings if f.fix is not None and f.fix.applicability == "safe")
    unsafe = sum(
        1 for f in result.findings if f.fix is not None and f.fix.applicability == "unsafe"
    )
    if safe or (unsafe and args.unsafe_fixes):
        k = safe + (unsafe if args.unsafe_fixes else 0)
        flag = "--fix --unsafe-fixes" if args.unsafe_fixes and unsafe else "--fix"
        print(f"[*] {k} fixable with `{flag}`.")
    if unsafe and not args.unsafe_fixes:
        print(f"({unsafe} more fixable with `--fix --unsafe-fixes`.)")


def _check_stdin(args: argparse.Namespace) -> int:
    """Lint source from standard input; with --fix, write the fixed source to stdout."""
    from trainlint.api import all_rules
    from trainlint.config import per_file_ignored
    from trainlint.engine import Linter
    from trainlint.fix import fix_text
    from trainlint.reporting import builtin_formats
    from trainlint.source import SourceError, decode

    name = args.stdin_filename or "-"
    settings = _load_settings(args, [Path(name) if args.stdin_filename else Path.cwd()])
    rules = all_rules(settings, catalog=True)
    selection = select_rules(
        rules,
        settings,
        cli_select=_selectors(args.select),
        cli_ignore=_selectors(args.ignore),
        cli_extend_select=_selectors(args.extend_select),
    )
    data = sys.stdin.buffer.read()
    linter = Linter(selection)
    ignored = per_file_ignored(settings, Path(name)) if args.stdin_filename else set()
    result = linter.lint_bytes(data, name, ignored=ignored)
    if args.fix or args.diff:
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
            if args.fix and not args.diff:
                sys.stdout.write(fixed)
                if _missing_libcst(remaining, args):
                    return 2
                return 1 if remaining and not args.exit_zero else 0
            from trainlint.fix import unified_diff

            sys.stdout.write(unified_diff(name, text, fixed))
            if _missing_libcst(remaining, args):
                return 2
            return 1 if fixed != text and not args.exit_zero else 0
    fmt = args.output_format or ("full" if args.show_source else "concise")
    sys.stdout.write(builtin_formats()[fmt](result.findings, rules))
    for err in result.errors:
        print(f"trainlint: error: {err}", file=sys.stderr)
    if result.errors:
        return 2
    return 1 if result.findings and not args.exit_zero else 0


def _make_cache(settings: Settings, selection: RuleSelection, rules: Sequence[type[Rule]]) -> Cache:
    from trainlint.cache import Cache  # (hashlib, json: a --no-cache run needs neither)

    directory = Path(settings.cache_dir) if settings.cache_dir else Path(".trainlint_cache")
    if not directory.is_absolute():
        directory = (settings.root if settings.config_path else Path.cwd()) / directory
    code = code_fingerprint(Path(__file__).parent)
    fingerprint = Cache.fingerprint_of(
        [
            sys.version_info[:2],  # what the parser accepts depends on the interpreter
            code,
            sorted(r.code for r in selection.rules),
            selection.options,
            sorted(f"{r.code}:{r.__module__}:{r.origin}" for r in rules),
            settings.plugins,
        ]
    )
    return Cache(directory, fingerprint, code)


@functools.cache
def code_fingerprint(package: Path) -> str:
    """A hash of trainlint's own modules: each one's path, size and modification time.
    A checkout (or an editable install) changes what it reports without changing its
    version; results cached by another build of the same version must not be served.
    A module's size and time are what Python itself trusts to tell whether its bytecode
    is current (the time in seconds; here in nanoseconds); reading the ~150 modules
    instead took 6.8 ms, their sizes and times 2.2."""
    import hashlib  # here: only a run with the cache on needs it

    rows = []
    for directory, _, names in os.walk(package):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    rel = os.path.relpath(path, package).replace(os.sep, "/")
                    rows.append(f"{rel}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()


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
            if args.output_format is None and args.show_source:
                args.output_format = "full"
            return cmd_check(args)
        if args.command == "debug":
            return cmd_debug_model(args.file)
        from trainlint.api import all_rules

        settings = _load_settings(args, [Path.cwd()])
        rules = all_rules(settings)
        if args.command == "rules":
            return cmd_rules(rules)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
