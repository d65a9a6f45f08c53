"""Benchmark trainlint against a bare libcst parse (and other linters, when installed).

    python bench/bench_lint.py [DIR ...] [--runs N] [--jobs N]

Default trees: the installed torch package's own ``nn``, ``optim`` and ``utils``
sources (always at hand where torch is installed). Every measurement is the median
of ``--runs`` runs, and results are printed as ratios to the bare
``libcst.parse_module`` of the same files measured in the same process, so numbers
from different machines compare. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path


def default_dirs() -> list[Path]:
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        assert spec is not None and spec.origin is not None
        root = Path(spec.origin).parent
    except (ImportError, AssertionError):
        sys.exit("torch is not installed: pass directories to benchmark")
    return [root / "nn", root / "optim", root / "utils"]


def collect(dirs: list[Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        files.extend(sorted(p for p in d.rglob("*.py") if p.is_file()))
    return files


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--others", action="store_true",
                        help="also time ruff/torchfix/fixit on the same files when installed")
    args = parser.parse_args(argv)
    dirs = args.dirs or default_dirs()
    files = collect(dirs)
    sources = [p.read_bytes() for p in files]
    size = sum(len(s) for s in sources)
    lines = sum(s.count(b"\n") for s in sources)
    print(f"{len(files)} files, {lines} lines, {size / 1e6:.1f} MB from {', '.join(map(str, dirs))}")

    import libcst

    from trainlint.cache import Cache
    from trainlint.config import Settings, select_rules
    from trainlint.rules import builtin_rules
    from trainlint.runner import run

    def parse_libcst() -> None:
        for s in sources:
            with contextlib.suppress(Exception):
                libcst.parse_module(s)

    def parse_ast() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for s in sources:
                with contextlib.suppress(SyntaxError, ValueError):
                    ast.parse(s)

    settings = Settings()
    selection = select_rules(builtin_rules(), settings, cli_select=["ALL"])

    def cold() -> None:
        run(files, selection, settings, jobs=1)

    def parallel() -> None:
        run(files, selection, settings, jobs=args.jobs)

    cache_dir = Path(tempfile.mkdtemp(prefix="trainlint-bench-"))
    try:
        cache = Cache(cache_dir, "bench")
        run(files, selection, settings, jobs=1, cache=cache)  # fill the cache

        def warm() -> None:
            run(files, selection, settings, jobs=1, cache=cache)

        results: list[tuple[str, float]] = []
        base = median_time(parse_libcst, args.runs)
        results.append(("libcst.parse_module (baseline)", base))
        results.append(("ast.parse", median_time(parse_ast, args.runs)))
        cold_t = median_time(cold, args.runs)
        results.append(("trainlint cold, 1 process, all rules", cold_t))
        results.append((f"trainlint cold, --jobs {args.jobs}", median_time(parallel, args.runs)))
        warm_t = median_time(warm, args.runs)
        results.append(("trainlint warm (cache)", warm_t))
        if args.others:
            results.extend(_others(files, args.runs))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)

    width = max(len(name) for name, _ in results)
    print(f"{'':{width}}  {'seconds':>8}  {'x libcst parse':>14}")
    for name, secs in results:
        print(f"{name:{width}}  {secs:8.3f}  {secs / base:14.3f}")
    print(f"warm / cold = {warm_t / cold_t:.3f}")
    return 0


def _others(files: list[Path], runs: int) -> list[tuple[str, float]]:
    """Other linters over the same files, through their CLIs, when they are installed."""
    out = []
    # A copy outside any git work tree: tools that honour .gitignore (fixit) would skip
    # files under an ignored site-packages and time nothing.
    copy_root = Path(tempfile.mkdtemp(prefix="trainlint-bench-others-"))
    listing = []
    for i, p in enumerate(files):
        target = copy_root / f"{i:05d}_{p.name}"
        target.write_bytes(p.read_bytes())
        listing.append(str(target))
    commands = {
        "ruff (all rules, no cache)": ["ruff", "check", "--no-cache", "--select", "ALL",
                                       "--exit-zero", "--quiet"],
        "torchfix": ["torchfix"],
        "fixit": ["fixit", "lint"],
    }
    for name, cmd in commands.items():
        if shutil.which(cmd[0]) is None:
            continue

        def go(cmd: list[str] = cmd) -> None:
            subprocess.run([*cmd, *listing], capture_output=True, check=False)

        out.append((name, median_time(go, runs)))
    shutil.rmtree(copy_root, ignore_errors=True)
    return out


if __name__ == "__main__":
    sys.exit(main())
