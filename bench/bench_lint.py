"""Benchmark trainlint against the parse floor, a bare libcst parse and ruff.

    python bench/bench_lint.py [DIR ...] [--runs N] [--jobs N] [--copies N] [--others]

Default trees: the installed torch package's own ``nn``, ``optim`` and ``utils``
sources (always at hand where torch is installed); pass directories for another tree.
``--training`` picks the training-heavy tree of issue 19, the pinned cleanrl and
litgpt sdists unpacked by ``bench/ecosystem.py`` (``--cache-dir``, default its own
cache); ``--timm`` the timm sdist from the same cache. Times are CPU seconds (user + system),
the minimum of ``--runs`` runs, so that other work on the machine matters less; they
are printed as ratios to the floor measured in the same process, and the cold/floor
ratio also as the median of paired runs (the steadier number on a shared machine):

* **floor**: read every file and ``ast.parse`` it, one process;
* **cold**: lint every file, all rules, one process, no cache; also as a ratio to its own
  reads and parses, timed in place file by file (the steady number on a VM whose speed
  drifts from one second to the next; stricter, as the run parses with the collector
  paused);
* **fix**: the same as cold with ``--diff --unsafe-fixes`` (every fix computed, libcst
  transforms included, nothing written); SPEC 12 wants it <= 2x cold, measured on
  ``fixtures/`` (``python bench/bench_lint.py fixtures``);
* **ruff**: ``ruff check --select ALL --no-cache``, one thread, over a copy of the
  same files (when ruff is installed), its own process's CPU;
* **peak memory**: maximum resident set of a separate process linting the tree
  ``--copies`` times over (memory should not grow with the tree), and of one that
  only parses it;
* **start-up**: a one-file ``trainlint check`` in a fresh process, beyond the
  interpreter's own start-up (``python -c pass``), with bytecode cached as an
  installed package has it (a primed private ``PYTHONPYCACHEPREFIX``).

Nothing here asserts on time.
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

SRC = str(Path(__file__).resolve().parent.parent / "src")


def default_dirs() -> list[Path]:
    try:
        import importlib.util

        spec = importlib.util.find_spec("torch")
        assert spec is not None and spec.origin is not None
        root = Path(spec.origin).parent
    except (ImportError, AssertionError):
        sys.exit("torch is not installed: pass directories to benchmark")
    return [root / "nn", root / "optim", root / "utils"]


#: the training-heavy tree: RL training scripts and LLM pretrain/finetune scripts, at the
#: versions bench/ecosystem/packages.toml pins (unpacked as <name>-<version>)
TRAINING_TREE = ("cleanrl-1.2.0", "litgpt-0.5.13")
TIMM_TREE = ("timm-1.0.31",)
ECOSYSTEM_CACHE = Path(__file__).resolve().parent / ".ecosystem-cache"


def cache_dirs(cache: Path, names: tuple[str, ...]) -> list[Path]:
    dirs = [cache / "src" / name for name in names]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        sys.exit(
            f"not unpacked: {', '.join(missing)}; run bench/ecosystem.py first "
            "(or pass --cache-dir)"
        )
    return dirs


def collect(dirs: list[Path]) -> list[Path]:
    files: list[Path] = []
    for d in dirs:
        files.extend(sorted(p for p in d.rglob("*.py") if p.is_file()))
    return files


def cpu_time(fn: Callable[[], object], runs: int) -> float:
    """Minimum CPU seconds of ``fn`` over ``runs`` runs (this process only)."""
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def own_floor_ratios(lint: Callable[[], object], runs: int) -> list[float]:
    """Each run's CPU time over the CPU time its own reads and parses took (each file's
    first read and first parse; a file linted again is the lint's cost), timed in place.

    The floor and the lint are then measured within milliseconds of each other, file by
    file: on a shared VM the same work's CPU time drifts by a third from one second to
    the next, which moves a ratio of separate runs by as much (the paired medians), not
    this one. It is the stricter ratio: the run parses with the collector paused, and a
    floor process's parses pay for collections.
    """
    import trainlint.engine as engine
    import trainlint.runner as runner
    import trainlint.workers as workers

    parse, read = engine.parse, workers.read_file
    spent = [0.0]
    seen: set[tuple[str, object]] = set()

    def timed(fn: Callable[..., object], kind: str) -> Callable[..., object]:
        def wrapper(*args: object) -> object:
            start = time.process_time()
            try:
                return fn(*args)
            finally:
                key = (kind, args[-1] if kind == "parse" else args[0])
                if key not in seen:
                    seen.add(key)
                    spent[0] += time.process_time() - start

        return wrapper

    engine.parse = timed(parse, "parse")  # type: ignore[assignment]
    workers.read_file = runner.read_file = timed(read, "read")  # type: ignore[assignment]
    ratios = []
    try:
        for _ in range(runs):
            spent[0] = 0.0
            seen.clear()
            start = time.process_time()
            lint()
            ratios.append((time.process_time() - start) / spent[0])
    finally:
        engine.parse, workers.read_file, runner.read_file = parse, read, read
    return sorted(ratios)


def child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``cmd``; its (CPU seconds, peak resident MiB), from the kernel's accounting."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})}
    )
    _, _, usage = os.wait4(proc.pid, 0)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def child_peak(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Run a Python ``cmd`` that prints its own peak resident MiB last; return that."""
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})}
    ).stdout
    return float(out.split()[-1])


def child_min(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> tuple[float, float]:
    results = [child(cmd, env) for _ in range(runs)]
    return min(r[0] for r in results), max(r[1] for r in results)


_PEAK = """
def _peak() -> None:
    # VmHWM is this process's own high-water mark; ru_maxrss would include the parent's
    # resident set at fork time, which Linux carries across exec.
    import resource
    try:
        with open("/proc/self/status") as fh:
            kib = next(int(x.split()[1]) for x in fh if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(kib / 1024)
_peak()
"""

_CHILD_LINT = (
    """
import sys
from pathlib import Path
from trainlint.config import Settings, select_rules
from trainlint.rules import builtin_rules
from trainlint.runner import run
files = [Path(p) for p in Path(sys.argv[1]).read_text().splitlines()]
settings = Settings()
selection = select_rules(builtin_rules(), settings, cli_select=["ALL"])
run(files * int(sys.argv[2]), selection, settings, jobs=1)
"""
    + _PEAK
)

_CHILD_PARSE = (
    """
import ast, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
for _ in range(int(sys.argv[2])):
    for p in Path(sys.argv[1]).read_text().splitlines():
        try:
            ast.parse(Path(p).read_bytes())
        except (SyntaxError, ValueError):
            pass
"""
    + _PEAK
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--copies",
        type=int,
        default=3,
        help="peak memory: lint the tree this many times over in one process",
    )
    parser.add_argument(
        "--others",
        action="store_true",
        help="also time torchfix/fixit on the same files when installed",
    )
    parser.add_argument(
        "--training",
        action="store_true",
        help="the training-heavy tree: cleanrl + litgpt from the ecosystem cache",
    )
    parser.add_argument("--timm", action="store_true", help="timm from the ecosystem cache")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=ECOSYSTEM_CACHE,
        help="bench/ecosystem.py's cache (default: bench/.ecosystem-cache)",
    )
    args = parser.parse_args(argv)
    dirs = list(args.dirs)
    if args.training:
        dirs += cache_dirs(args.cache_dir, TRAINING_TREE)
    if args.timm:
        dirs += cache_dirs(args.cache_dir, TIMM_TREE)
    dirs = dirs or default_dirs()
    files = collect(dirs)
    sources = [p.read_bytes() for p in files]
    size = sum(len(s) for s in sources)
    lines = sum(s.count(b"\n") for s in sources)
    print(
        f"{len(files)} files, {lines} lines, {size / 1e6:.1f} MB from {', '.join(map(str, dirs))}"
    )

    from trainlint.cache import Cache
    from trainlint.config import Settings, select_rules
    from trainlint.rules import builtin_rules
    from trainlint.runner import FixMode, run

    def floor() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for p in files:
                with contextlib.suppress(SyntaxError, ValueError):
                    ast.parse(p.read_bytes())

    settings = Settings()
    selection = select_rules(builtin_rules(), settings, cli_select=["ALL"])

    def cold() -> None:
        run(files, selection, settings, jobs=1)

    def parallel() -> None:
        run(files, selection, settings, jobs=args.jobs)

    work = Path(tempfile.mkdtemp(prefix="trainlint-bench-"))
    try:
        cache = Cache(work / "cache", "bench")
        run(files, selection, settings, jobs=1, cache=cache)  # fill the cache

        def warm() -> None:
            run(files, selection, settings, jobs=1, cache=cache)

        # floor and cold interleaved, each cold run between two floor runs, so that a
        # busy machine slows both alike: on a shared host one run's CPU time moves by a
        # third from one minute to the next, and each minimum may come from another minute
        floors = [cpu_time(floor, 1)]
        colds: list[float] = []
        for _ in range(args.runs):
            colds.append(cpu_time(cold, 1))
            floors.append(cpu_time(floor, 1))
        floor_t, cold_t = min(floors), min(colds)
        paired = sorted(
            c * 2 / (a + b) for c, a, b in zip(colds, floors[:-1], floors[1:], strict=True)
        )
        rows: list[tuple[str, float]] = [
            ("ast.parse floor (read + parse)", floor_t),
            ("trainlint cold, 1 process, all rules", cold_t),
        ]
        with contextlib.suppress(ImportError):
            import libcst

            def parse_libcst() -> None:
                for s in sources:
                    with contextlib.suppress(Exception):
                        libcst.parse_module(s)

            rows.append(("libcst.parse_module (SPEC 12 baseline)", cpu_time(parse_libcst, 1)))
        start = time.perf_counter()
        parallel()
        rows.append(
            (f"trainlint cold, --jobs {args.jobs} (wall clock)", time.perf_counter() - start)
        )
        warm_t = cpu_time(warm, args.runs)
        rows.append(("trainlint warm (cache)", warm_t))

        def fix() -> None:
            run(files, selection, settings, jobs=1, fix=FixMode(diff=True, unsafe=True))

        fix_t = cpu_time(fix, args.runs)
        rows.append(("trainlint --diff --unsafe-fixes, 1 process", fix_t))

        copy_root = work / "copy"
        listing = _copy_files(files, copy_root)
        list_file = work / "files.txt"
        list_file.write_text("\n".join(map(str, files)))
        env = {"PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
        if shutil.which("ruff"):
            ruff_t, _ = child_min(
                [
                    "ruff",
                    "check",
                    "--no-cache",
                    "--select",
                    "ALL",
                    "--exit-zero",
                    "--quiet",
                    "--isolated",
                    *listing,
                ],
                args.runs,
                {"RAYON_NUM_THREADS": "1"},
            )
            rows.append(("ruff --select ALL, one thread (whole process)", ruff_t))
        if args.others:
            rows.extend(_others(listing, args.runs))

        width = max(len(name) for name, _ in rows)
        print(f"\n{'':{width}}  {'CPU s':>7}  {'x floor':>7}")
        for name, secs in rows:
            print(f"{name:{width}}  {secs:7.3f}  {secs / floor_t:7.2f}")
        print(
            f"cold / floor, paired (each cold run over the mean of the floor runs before and "
            f"after it): median {statistics.median(paired):.2f}, range "
            f"{paired[0]:.2f}-{paired[-1]:.2f} over {len(paired)} runs"
        )
        own = own_floor_ratios(cold, args.runs)
        print(
            f"cold / its own reads and parses (timed in place, file by file): median "
            f"{statistics.median(own):.2f}, range {own[0]:.2f}-{own[-1]:.2f} over {len(own)} runs"
        )
        print(f"warm / cold = {warm_t / cold_t:.3f}")
        print(f"fix / cold = {fix_t / cold_t:.2f} (SPEC: <= 2 on fixtures/)")
        if shutil.which("ruff"):
            print(f"cold / ruff = {cold_t / ruff_t:.2f} (trainlint in-process, ruff whole process)")

        lint_mem = child_peak(
            [sys.executable, "-c", _CHILD_LINT, str(list_file), str(args.copies)], env
        )
        parse_mem = child_peak(
            [sys.executable, "-c", _CHILD_PARSE, str(list_file), str(args.copies)], env
        )
        print(
            f"\npeak memory, the tree {args.copies}x in one process: lint {lint_mem:.0f} MiB "
            f"(parse only: {parse_mem:.0f} MiB)"
        )

        one = copy_root / "one_file.py"
        one.write_text("import torch\n\nx = torch.zeros(3)\n")
        # As installed: with bytecode. Where PYTHONDONTWRITEBYTECODE is set (and src/ has
        # no __pycache__), every start would compile all of trainlint's modules again,
        # over twice the time measured here; a primed private pycache stands in.
        startup_env = {
            **env,
            "PYTHONPYCACHEPREFIX": str(work / "pycache"),
            "PYTHONDONTWRITEBYTECODE": "",
        }
        check_cmd = [
            sys.executable,
            "-m",
            "trainlint",
            "check",
            "--no-cache",
            "-q",
            "--exit-zero",
            str(one),
        ]
        child(check_cmd, startup_env)  # prime the bytecode cache
        bare, _ = child_min([sys.executable, "-c", "pass"], max(args.runs, 5), startup_env)
        check, _ = child_min(check_cmd, max(args.runs, 5), startup_env)
        print(
            f"start-up: `trainlint check one_file.py` {check:.3f} s CPU, the interpreter "
            f"alone {bare:.3f} s: {check - bare:.3f} s beyond it"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _copy_files(files: list[Path], root: Path) -> list[str]:
    """A flat copy outside any git work tree and site-packages: ruff skips site-packages
    by default and tools that honour .gitignore would skip ignored trees."""
    root.mkdir(parents=True)
    listing = []
    for i, p in enumerate(files):
        target = root / f"{i:05d}_{p.name}"
        target.write_bytes(p.read_bytes())
        listing.append(str(target))
    return listing


def _others(listing: list[str], runs: int) -> list[tuple[str, float]]:
    """Other linters over the same files, through their CLIs, when they are installed."""
    out = []
    commands = {
        "torchfix (whole process)": ["torchfix"],
        "fixit (whole process)": ["fixit", "lint"],
    }
    for name, cmd in commands.items():
        if shutil.which(cmd[0]) is not None:
            out.append((name, child_min([*cmd, *listing], runs)[0]))
    return out


if __name__ == "__main__":
    sys.exit(main())
