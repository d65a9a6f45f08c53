"""``trainlint check PATHS``: which settings each file gets, the runs, and what is printed
(reading standard input is :mod:`trainlint.check_stdin`'s)."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlint.config import ConfigError, select_rules
from trainlint.config_tree import ConfigTree
from trainlint.settings import RuleSelection, Settings

if TYPE_CHECKING:
    from trainlint.cache import Cache
    from trainlint.findings import Finding
    from trainlint.rules.base import Rule
    from trainlint.runner import RunResult


def selectors(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    out: list[str] = []
    for v in values:
        out.extend(s.strip().upper() for s in v.split(",") if s.strip())
    return out


def patterns(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def config_tree(args: argparse.Namespace) -> ConfigTree:
    """The settings of every file: its nearest config (or ``--config``), with what the
    command line changes in each."""

    def adjust(settings: Settings) -> None:
        if getattr(args, "exclude", None) is not None:
            settings.exclude = patterns(args.exclude) or []
        if getattr(args, "extend_exclude", None) is not None:
            settings.extend_exclude = [
                *settings.extend_exclude,
                *(patterns(args.extend_exclude) or []),
            ]
        if getattr(args, "target_torch", None) is not None:
            from trainlint.config import TARGET_TORCH, _torch_setting

            settings.target_torch = _torch_setting(
                args.target_torch, "--" + TARGET_TORCH, "command line"
            )

    forced = Path(args.config) if getattr(args, "config", None) else None
    return ConfigTree(forced, adjust)


def selection_of(
    args: argparse.Namespace, settings: Settings, *, catalog: bool = True
) -> tuple[list[type[Rule]], RuleSelection]:
    """The rules ``settings`` knows, and those the command line and it select."""
    from trainlint.api import all_rules

    rules = all_rules(settings, catalog=catalog)
    selection = select_rules(
        rules,
        settings,
        cli_select=selectors(args.select),
        cli_ignore=selectors(args.ignore),
        cli_extend_select=selectors(args.extend_select),
    )
    return rules, selection


def output_format(args: argparse.Namespace) -> str:
    """The format asked for: the flag, else ``TRAINLINT_OUTPUT_FORMAT``, else concise."""
    if args.output_format:
        return str(args.output_format)
    if args.show_source:
        return "full"
    return os.environ.get("TRAINLINT_OUTPUT_FORMAT", "").strip() or "concise"


def formats_for(fmt: str, settings: Sequence[Settings]) -> dict[str, Any]:
    """Every format the run can print (ours and the plugins' of each settings); an unknown
    ``fmt`` is a usage error, raised before anything is linted."""
    from trainlint.plugins.manager import load_formats
    from trainlint.reporting import builtin_formats

    formats: dict[str, Any] = builtin_formats()
    for s in settings:
        beside = str(s.root) if s.config_path is not None else None
        for name, formatter in load_formats(s.plugins, beside).items():
            formats.setdefault(name, formatter)
    if fmt not in formats:
        raise ConfigError(f"unknown --output-format `{fmt}` (choose from {', '.join(formats)})")
    return formats


def cmd_check(args: argparse.Namespace) -> int:
    from trainlint.discovery import DiscoveryError, discover
    from trainlint.runner import FixMode, RunResult, run

    if args.paths == ["-"]:
        from trainlint.check_stdin import check_stdin

        return check_stdin(args)
    if args.jobs is not None and args.jobs < 0:
        raise ConfigError("--jobs must be >= 0")
    paths = [Path(p) for p in (args.paths or ["."])]
    tree = config_tree(args)
    try:
        files = list(discover(paths, tree.settings_for, force_exclude=args.force_exclude))
    except DiscoveryError as exc:
        raise ConfigError(str(exc)) from None
    groups = tree.group(files)
    fmt = output_format(args)
    shown = [s for s, _ in groups] or [tree.settings_for(Path.cwd())]
    formats = formats_for(fmt, shown)
    if args.show_files:
        for f in files:
            print(f.as_posix())
        return 0
    if args.show_settings:
        from trainlint.check_stdin import show_settings

        return show_settings(args, groups, shown)
    if not files and not args.quiet:
        print("trainlint: warning: no Python files or notebooks found to lint", file=sys.stderr)
    fix = FixMode(
        write=(args.fix or args.fix_only) and not args.diff,
        diff=args.diff,
        unsafe=args.unsafe_fixes,
    )
    result = RunResult()
    all_known: dict[str, type[Rule]] = {}
    for settings, group in groups:
        # the catalog's stand-ins import each rule when it first runs; --timings times the
        # rules' checks, not their imports
        rules, selection = selection_of(args, settings, catalog=not args.timings)
        for r in rules:
            all_known.setdefault(r.code, r)
        cache = None if args.no_cache or args.timings else make_cache(settings, selection, rules)
        part = run(
            group,
            selection,
            settings,
            jobs=args.jobs or settings.jobs,
            timings=args.timings,
            fix=fix if fix.active else None,
            cache=cache,
        )
        merge(result, part)
    if not all_known:
        all_known = {r.code: r for r in selection_of(args, shown[0])[0]}
    rules = sorted(all_known.values(), key=lambda r: r.code)
    if args.add_noqa:
        from trainlint.add_noqa import add_noqa

        added = add_noqa(result.findings)
        print(f"Added `noqa` directives for {count(added, 'finding')}.", file=sys.stderr)
        for err in result.errors:
            print(f"trainlint: error: {err}", file=sys.stderr)
        return 2 if result.errors else 0
    with _output(args) as out:
        return report(args, fmt, formats, result, rules, out)


def merge(into: RunResult, part: RunResult) -> None:
    from trainlint.findings import Finding

    into.findings = sorted([*into.findings, *part.findings], key=Finding.sort_key)
    into.errors.extend(part.errors)
    into.files += part.files
    into.fixed += part.fixed
    into.fixed_files.extend(part.fixed_files)
    into.diffs.extend(part.diffs)
    for code, t in part.timings.items():
        into.timings[code] = into.timings.get(code, 0.0) + t


@contextlib.contextmanager
def _output(args: argparse.Namespace) -> Any:
    """Where the report goes: stdout, or ``--output-file`` (written whole at the end)."""
    if not getattr(args, "output_file", None):
        yield sys.stdout
        return
    import io

    buffer = io.StringIO()
    yield buffer
    target = Path(args.output_file)
    if target.parent != Path(""):
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(buffer.getvalue(), encoding="utf-8")


def report(
    args: argparse.Namespace,
    fmt: str,
    formats: dict[str, Any],
    result: RunResult,
    rules: Sequence[type[Rule]],
    out: Any,
) -> int:
    """Print the run's outcome and return the exit status."""
    if args.diff:
        for diff in result.diffs:
            out.write(diff)
        if not args.quiet:
            left = len(result.findings)
            rest = (
                f"; {count(left, 'finding')} would remain (run without `--diff` to list "
                "them; they do not change the exit status)"
                if left
                else ""
            )
            print(f"Would fix {count(result.fixed, 'finding')}{rest}.", file=sys.stderr)
            hidden = unsafe_count(result.findings) if not args.unsafe_fixes else 0
            if hidden:
                print(
                    f"({count(hidden, 'unsafe fix', 'es')} not shown: add `--unsafe-fixes`.)",
                    file=sys.stderr,
                )
        for err in result.errors:
            print(f"trainlint: error: {err}", file=sys.stderr)
        if result.errors or missing_libcst(result.findings, args):
            return 2
        return 1 if result.diffs and not args.exit_zero else 0
    if args.statistics:
        out.write(statistics(result.findings, fmt))
    elif not args.fix_only:
        if formats[fmt].__module__ != "trainlint.reporting":
            # a plugin's format is handed the rule classes themselves (ours read only the
            # metadata and documentation that the catalog's stand-ins have)
            from trainlint.rules import real_rule

            rules = [real_rule(r) for r in rules]
        text = formats[fmt](result.findings, rules)
        if fmt in ("concise", "full"):
            from trainlint.reporting.text import colorize, wants_color

            if wants_color(args.color, out):
                text = colorize(text)
        out.write(text)
    if fmt in ("concise", "full") and not args.quiet:
        print_summary(result, args, out)
    for err in result.errors:
        print(f"trainlint: error: {err}", file=sys.stderr)
    if args.timings:
        for code, secs in sorted(result.timings.items(), key=lambda kv: -kv[1]):
            print(f"{secs * 1000:10.1f} ms  {code}", file=sys.stderr)
    fixing = args.fix or args.fix_only
    if result.errors or (fixing and missing_libcst(result.findings, args)):
        return 2
    if args.exit_non_zero_on_fix and result.fixed:
        return 1
    if args.exit_zero or args.fix_only:
        return 0
    return result.exit_code


def statistics(findings: Sequence[Finding], fmt: str) -> str:
    """Counts per rule: a table, or a JSON list in the machine-readable formats."""
    from collections import Counter

    counts = Counter((f.code, f.name) for f in findings)
    fixable = Counter((f.code, f.name) for f in findings if f.fix is not None)
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if fmt in ("json", "json-lines"):
        import json

        items = [
            {"code": code, "name": name, "count": n, "fixable": fixable[(code, name)]}
            for (code, name), n in rows
        ]
        return json.dumps(items, indent=2) + "\n"
    return "".join(f"{n:>5}  {code}  {name}\n" for (code, name), n in rows)


def unsafe_count(findings: Sequence[Finding]) -> int:
    return sum(1 for f in findings if f.fix is not None and f.fix.applicability == "unsafe")


def missing_libcst(findings: list[Finding], args: argparse.Namespace) -> bool:
    """A fix that moves statements was asked for and libcst is not installed: say what
    to install (one line, on stderr); the text-only fixes were applied all the same."""
    from trainlint.fix import MISSING_LIBCST, needs_libcst

    if needs_libcst(findings, args.unsafe_fixes):
        print(MISSING_LIBCST, file=sys.stderr)
        return True
    return False


def count(n: int, noun: str, plural: str = "s") -> str:
    return f"{n} {noun}{plural if n != 1 else ''}"


def print_summary(result: RunResult, args: argparse.Namespace, out: Any = None) -> None:
    """The closing lines: what was fixed, found (in how many of the files checked), fixable.
    A flag the run already had is never suggested again (without libcst, a fix it asked
    for stays; the line on stderr says what to install)."""
    out = out or sys.stdout
    n = len(result.findings)
    if result.fixed:
        print(f"Fixed {count(result.fixed, 'finding')}.", file=out)
        if args.show_fixes:
            for path, n in result.fixed_files:
                print(f"  {path}: {count(n, 'fix', 'es')}", file=out)
    if not n:
        print(f"All checks passed ({count(result.files, 'file')}).", file=out)
        return
    print(
        f"Found {count(n, 'finding')} in {result.files_with_findings} of "
        f"{count(result.files, 'file')}.",
        file=out,
    )
    safe = sum(1 for f in result.findings if f.fix is not None and f.fix.applicability == "safe")
    unsafe = unsafe_count(result.findings)
    listed = (safe or (unsafe and args.unsafe_fixes)) and not args.fix
    if listed:
        k = safe + (unsafe if args.unsafe_fixes else 0)
        flag = "--fix --unsafe-fixes" if args.unsafe_fixes and unsafe else "--fix"
        print(f"[*] {k} fixable with `{flag}`.", file=out)
    if unsafe and not args.unsafe_fixes:
        more = "more " if listed else ""
        print(f"({unsafe} {more}fixable with `--fix --unsafe-fixes`.)", file=out)


def make_cache(settings: Settings, selection: RuleSelection, rules: Sequence[type[Rule]]) -> Cache:
    """The cache of one config's files, keyed on that config's effective settings."""
    from trainlint.cache import Cache  # (hashlib, json: a --no-cache run needs neither)

    directory = cache_directory(settings)
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


def cache_directory(settings: Settings) -> Path:
    """Where one config's cache lives: ``cache-dir`` relative to the config's directory."""
    directory = Path(settings.cache_dir) if settings.cache_dir else Path(".trainlint_cache")
    if not directory.is_absolute():
        directory = (settings.root if settings.config_path else Path.cwd()) / directory
    return directory


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
