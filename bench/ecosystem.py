"""Ecosystem check: lint pinned real-world training packages, compare with a reviewed ledger.

    python bench/ecosystem.py                      # lint all, compare, print the summary
    python bench/ecosystem.py --packages trl,timm  # only these packages
    python bench/ecosystem.py --select TL4         # passed through to ``trainlint check``
    python bench/ecosystem.py --update [--prune]   # write new findings as unreviewed
    python bench/ecosystem.py --check              # exit 1 on a failing gate (see below)
    python bench/ecosystem.py --json               # machine-readable summary on stdout
    python bench/ecosystem.py --pin NAME==VERSION  # print a packages.toml entry to paste

The packages and their exact artifacts (file name and sha256) are pinned in
``bench/ecosystem/packages.toml``. Each artifact is fetched once from PyPI's simple
index (the JSON form of the API pip itself reads), checked against its pinned sha256,
and unpacked under the ignored ``bench/.ecosystem-cache/``; later runs use the cache
and never touch the network. Artifacts are fetched directly rather than with
``pip download`` because pip builds an sdist's metadata, which runs the package's own
``setup.py`` (and, in build isolation, installs torch and friends as build
dependencies): several sdists here fail that step or take minutes, and nothing from
these packages should be executed just to lint them.

Each package's ``*.py`` files (minus vendored folders and the entry's ``exclude``
globs) are linted by the installed trainlint's CLI
(``trainlint check --output-format json --no-cache --exit-zero``) with its default rule
selection, or ``--select``. An empty ``trainlint.toml`` at the top of the unpacked
tree stops config discovery there, so a package is linted with its own
``[tool.trainlint]`` if it has one and with trainlint's defaults otherwise, never with
this repository's settings.

Findings are matched to ``bench/ecosystem/ledger.jsonl`` (one reviewed finding per
line) on (package, path, code, flagged source line with whitespace collapsed), so a
finding keeps its review when unrelated edits shift lines or a version bump leaves the
line alone; ``line``, ``version`` and ``message`` are kept for information. Repeated
keys pair up in line order. A finding without a ledger entry is NEW (counted as
unreviewed); a ledger entry no longer produced is GONE. Precision per rule is
true / (true + false + noise) over the findings produced now.

``--check`` exits 1 when a default-enabled rule is below 0.9 precision, when any
finding produced now is unreviewed, or when a finding reviewed as true is GONE (a lost
true positive: a rule may get quieter, but not by dropping real bugs). It needs the
downloads, so it is not part of ``.ci/run``; ``tests/test_ecosystem_tool.py`` covers
the comparison offline.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
DATA = HERE / "ecosystem"
PACKAGES_FILE = DATA / "packages.toml"
LEDGER_FILE = DATA / "ledger.jsonl"
CACHE_DIR = HERE / ".ecosystem-cache"
SIMPLE_INDEX = "https://pypi.org/simple"

VERDICTS = ("true", "false", "noise", "unreviewed")
PRECISION_GATE = 0.9
#: Folders never linted: other projects' code copied in, and build leftovers.
SKIP_DIRS = frozenset(
    {
        "__pycache__",
        ".git",
        ".hg",
        ".tox",
        ".venv",
        "node_modules",
        "third_party",
        "thirdparty",
        "third-party",
        "vendor",
        "_vendor",
        "vendored",
    }
)
#: Fields of a ledger entry, in the order they are written.
LEDGER_FIELDS = (
    "package",
    "version",
    "path",
    "line",
    "code",
    "text",
    "message",
    "verdict",
    "reason",
)


# --------------------------------------------------------------------------- packages


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    artifact: str  # "sdist" or "wheel"
    filename: str
    sha256: str
    exclude: tuple[str, ...] = ()
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


def load_packages(path: Path = PACKAGES_FILE) -> list[Package]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for entry in data.get("package", []):
        out.append(
            Package(
                name=entry["name"],
                version=entry["version"],
                artifact=entry["artifact"],
                filename=entry["filename"],
                sha256=entry["sha256"],
                exclude=tuple(entry.get("exclude", ())),
                note=entry.get("note", ""),
            )
        )
    names = [p.name for p in out]
    dupes = sorted(n for n, c in Counter(names).items() if c > 1)
    if dupes:
        raise SystemExit(f"{path}: packages listed twice: {', '.join(dupes)}")
    return out


def simple_index_files(name: str) -> list[dict[str, Any]]:
    """The files PyPI lists for a project (PEP 691 JSON), as pip sees them."""
    req = urllib.request.Request(
        f"{SIMPLE_INDEX}/{name}/",
        headers={
            "Accept": "application/vnd.pypi.simple.v1+json",
            "User-Agent": "trainlint-ecosystem-check",
        },
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return list(json.load(resp)["files"])


def download(pkg: Package, dest: Path) -> Path:
    """The pinned artifact, from the cache or PyPI, verified against its sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / pkg.filename
    if target.is_file() and _sha256(target) == pkg.sha256:
        return target
    files = [f for f in simple_index_files(pkg.name) if f["filename"] == pkg.filename]
    if not files:
        raise RuntimeError(f"{pkg.name}: {pkg.filename} is not on {SIMPLE_INDEX}")
    fd, tmp = tempfile.mkstemp(dir=dest, prefix=".part-")
    try:
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(files[0]["url"], timeout=600) as resp,
        ):
            shutil.copyfileobj(resp, out)
        digest = _sha256(Path(tmp))
        if digest != pkg.sha256:
            raise RuntimeError(
                f"{pkg.filename}: sha256 {digest} does not match the pin {pkg.sha256}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def unpacked_root(pkg: Package, cache: Path) -> Path:
    return cache / "src" / pkg.key


def ensure_unpacked(pkg: Package, cache: Path) -> Path:
    """The package's source tree (its root is the sdist's top folder or the wheel's root).

    Unpacked once into a temporary folder and renamed into place, so an interrupted run
    never leaves a half tree that later runs would trust.
    """
    root = unpacked_root(pkg, cache)
    _write_config_stop(cache / "src")
    if (root / ".ecosystem-complete").is_file():
        return root
    archive = download(pkg, cache / "downloads")
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{pkg.key}-"))
    try:
        _extract(archive, tmp)
        entries = list(tmp.iterdir())
        # An sdist has exactly one top folder (name-version/): paths are relative to it.
        top = (
            entries[0]
            if len(entries) == 1 and entries[0].is_dir() and pkg.artifact == "sdist"
            else tmp
        )
        (top / ".ecosystem-complete").write_text(f"{pkg.filename} {pkg.sha256}\n", encoding="utf-8")
        if root.exists():
            shutil.rmtree(root)
        os.replace(top, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _write_config_stop(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    stop = directory / "trainlint.toml"
    if not stop.exists():
        stop.write_text(
            "# Empty on purpose: config discovery for the unpacked packages stops here, so\n"
            "# they are linted with trainlint's defaults, not this repository's settings.\n",
            encoding="utf-8",
        )


def _extract(archive: Path, dest: Path) -> None:
    name = archive.name
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                _check_member(member, dest)
            zf.extractall(dest)
    elif name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar")):
        with tarfile.open(archive) as tf:
            if hasattr(tarfile, "data_filter"):
                tf.extractall(dest, filter="data")
            else:  # pragma: no cover - Python without PEP 706
                members = [m for m in tf.getmembers() if m.isfile() or m.isdir()]
                for m in members:
                    _check_member(m.name, dest)
                tf.extractall(dest, members=members)
    else:
        raise RuntimeError(f"{archive}: unknown archive type")


def _check_member(member: str, dest: Path) -> None:
    target = (dest / member).resolve()
    if not target.is_relative_to(dest.resolve()):
        raise RuntimeError(f"archive member escapes the folder: {member}")


def python_files(root: Path, exclude: Iterable[str] = ()) -> list[str]:
    """``*.py`` files under root, as sorted posix paths relative to it."""
    patterns = list(exclude)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS
            and not d.endswith(".egg-info")
            and not _excluded(rel_dir + d, patterns)
        )
        for fname in filenames:
            rel = rel_dir + fname
            if fname.endswith(".py") and not _excluded(rel, patterns):
                out.append(rel)
    return sorted(out)


def _excluded(rel: str, patterns: Sequence[str]) -> bool:
    return any(
        fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(rel, p.rstrip("/") + "/*")
        for p in patterns
    )


# --------------------------------------------------------------------------- linting


def normalise(line: str) -> str:
    """The flagged source line as the match key holds it: whitespace collapsed."""
    return " ".join(line.split())


def source_line(root: Path, rel: str, line: int, _cache: dict[str, list[str]] | None = None) -> str:
    cache = _cache if _cache is not None else {}
    if rel not in cache:
        try:
            text = (root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        cache[rel] = text.splitlines()
    lines = cache[rel]
    return lines[line - 1] if 0 < line <= len(lines) else ""


def lint_package(
    root: Path, files: Sequence[str], *, select: str | None = None, jobs: int | None = None
) -> list[dict[str, Any]]:
    """Raw findings (trainlint's JSON objects) for ``files`` under ``root``."""
    if not files:
        return []
    cmd = [
        sys.executable,
        "-m",
        "trainlint",
        "check",
        "--output-format",
        "json",
        "--no-cache",
        "--exit-zero",
    ]
    if select:
        cmd += ["--select", select]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    cmd += ["--", *files]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"trainlint failed in {root} (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return list(json.loads(proc.stdout or "[]"))


def findings_to_records(
    pkg_name: str, version: str, root: Path, raw: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Ledger-shaped records (verdict not yet known) for the CLI's findings."""
    lines: dict[str, list[str]] = {}
    out = []
    for f in raw:
        path = Path(f["path"])
        rel = (
            path.relative_to(root) if path.is_absolute() and path.is_relative_to(root) else path
        ).as_posix()
        line = int(f.get("line") or 0)
        out.append(
            {
                "package": pkg_name,
                "version": version,
                "path": rel,
                "line": line,
                "code": f["code"],
                "text": normalise(source_line(root, rel, line, lines)),
                "message": f.get("message", ""),
            }
        )
    out.sort(key=lambda r: (r["path"], r["line"], r["code"], r["message"]))
    return out


# --------------------------------------------------------------------------- the ledger


def match_key(rec: dict[str, Any]) -> tuple[str, str, str, str]:
    return (rec["package"], rec["path"], rec["code"], rec["text"])


def read_ledger(path: Path = LEDGER_FILE) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path}:{n}: not JSON: {exc}") from None
        missing = [k for k in ("package", "path", "code", "text", "verdict") if k not in entry]
        if missing:
            raise SystemExit(f"{path}:{n}: missing {', '.join(missing)}")
        if entry["verdict"] not in VERDICTS:
            raise SystemExit(f"{path}:{n}: verdict must be one of {', '.join(VERDICTS)}")
        out.append(entry)
    return out


def write_ledger(entries: Iterable[dict[str, Any]], path: Path = LEDGER_FILE) -> None:
    ordered = sorted(
        entries, key=lambda e: (e["package"], e["path"], e.get("line", 0), e["code"], e["text"])
    )
    lines = []
    for e in ordered:
        row = {k: e.get(k, "") for k in LEDGER_FIELDS}
        row.update({k: v for k, v in e.items() if k not in row})  # keep extra fields
        lines.append(json.dumps(row, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class Comparison:
    #: (current finding, its ledger entry) for every finding produced now that has one.
    matched: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    gone: list[dict[str, Any]] = field(default_factory=list)
    #: ledger entries outside this run's packages or rules, kept as they are.
    untouched: list[dict[str, Any]] = field(default_factory=list)

    def verdict_of(self) -> list[tuple[dict[str, Any], str]]:
        """Every finding produced now with its verdict (NEW ones are unreviewed)."""
        return [(cur, entry["verdict"]) for cur, entry in self.matched] + [
            (cur, "unreviewed") for cur in self.new
        ]


def compare(
    current: Sequence[dict[str, Any]],
    ledger: Sequence[dict[str, Any]],
    *,
    packages: set[str],
    codes: set[str] | None,
) -> Comparison:
    """Pair findings with ledger entries on :func:`match_key`.

    Only ledger entries of ``packages`` whose code is in ``codes`` (None: any code)
    can be GONE; the rest are reported untouched. Within one key, findings and
    entries pair up in line order, so a key repeated in a file keeps its reviews.
    """
    result = Comparison()
    in_scope: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for entry in ledger:
        if entry["package"] in packages and (codes is None or entry["code"] in codes):
            in_scope[match_key(entry)].append(entry)
        else:
            result.untouched.append(entry)
    by_key: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for rec in current:
        by_key[match_key(rec)].append(rec)
    for key, recs in by_key.items():
        entries = sorted(in_scope.pop(key, []), key=lambda e: e.get("line", 0))
        recs = sorted(recs, key=lambda r: r["line"])
        if len(entries) > len(recs):
            # Keep the entries nearest the current lines; the rest are gone.
            entries, extra = _nearest(entries, recs)
            result.gone.extend(extra)
        for rec, entry in zip(recs, entries, strict=False):  # surplus recs are NEW
            result.matched.append((rec, entry))
        result.new.extend(recs[len(entries) :])
    for entries in in_scope.values():
        result.gone.extend(entries)
    result.new.sort(key=lambda r: (r["package"], r["path"], r["line"], r["code"]))
    result.gone.sort(key=lambda r: (r["package"], r["path"], r.get("line", 0), r["code"]))
    return result


def _nearest(
    entries: list[dict[str, Any]], recs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    keep: list[dict[str, Any]] = []
    pool = list(entries)
    for rec in recs:
        best = min(pool, key=lambda e: abs(e.get("line", 0) - rec["line"]))
        pool.remove(best)
        keep.append(best)
    keep.sort(key=lambda e: e.get("line", 0))
    return keep, pool


def updated_ledger(cmp: Comparison, *, prune: bool) -> list[dict[str, Any]]:
    """The ledger after ``--update``: reviews kept, line/version/message refreshed,
    NEW findings added as unreviewed, GONE entries dropped only with ``prune``."""
    out = list(cmp.untouched)
    for cur, entry in cmp.matched:
        out.append(
            {**entry, "version": cur["version"], "line": cur["line"], "message": cur["message"]}
        )
    for cur in cmp.new:
        out.append({**cur, "verdict": "unreviewed", "reason": ""})
    if not prune:
        out.extend(cmp.gone)
    return out


# --------------------------------------------------------------------------- summaries


def precision(counts: dict[str, int]) -> float | None:
    reviewed = counts.get("true", 0) + counts.get("false", 0) + counts.get("noise", 0)
    return counts.get("true", 0) / reviewed if reviewed else None


def tally(pairs: Iterable[tuple[dict[str, Any], str]], key: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(("findings", *VERDICTS), 0))
    for rec, verdict in pairs:
        row = out[rec[key]]
        row["findings"] += 1
        row[verdict] += 1
    return dict(out)


def gate_failures(cmp: Comparison, default_codes: set[str]) -> list[str]:
    """Why ``--check`` fails (empty: it passes)."""
    failures = []
    per_rule = tally(cmp.verdict_of(), "code")
    for code, counts in sorted(per_rule.items()):
        p = precision(counts)
        if code in default_codes and p is not None and p < PRECISION_GATE:
            failures.append(f"{code}: precision {p:.2f} < {PRECISION_GATE} (default-enabled)")
    unreviewed = sum(c["unreviewed"] for c in per_rule.values())
    if unreviewed:
        failures.append(f"{unreviewed} finding(s) not reviewed (verdict unreviewed or NEW)")
    # A true finding may leave the default only as a documented opt-in sub-pattern: its
    # ledger entry names the rule option that reports it (`opt_in`).
    lost = [e for e in cmp.gone if e["verdict"] == "true" and not e.get("opt_in")]
    if lost:
        failures.append(f"{len(lost)} finding(s) reviewed as true are GONE")
    return failures


def rule_table() -> dict[str, dict[str, Any]]:
    """code -> {name, default} from the installed trainlint (default: enabled by default)."""
    from trainlint.api import all_rules

    return {
        r.code: {
            "name": getattr(r, "name", ""),
            "default": bool(getattr(r, "default_enabled", True)),
        }
        for r in all_rules()
    }


def selected_codes(rules: dict[str, dict[str, Any]], select: str | None) -> set[str]:
    """The codes a run lints with: the default set, or what ``--select`` prefixes name."""
    if not select:
        return {c for c, r in rules.items() if r["default"]}
    prefixes = [s.strip() for s in select.split(",") if s.strip()]
    if any(p.upper() == "ALL" for p in prefixes):
        return set(rules)
    return {c for c in rules if any(c.startswith(p) for p in prefixes)}


def trainlint_provenance() -> str:
    """Which trainlint linted: version, source folder and its git commit (if any)."""
    import trainlint

    src = Path(trainlint.__file__).resolve().parent
    version = f"trainlint {getattr(trainlint, '__version__', '?')}"
    where = f"{version} from {src}"
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return where
    if head.returncode != 0:
        return where
    return f"{version} (git {head.stdout.strip()}{', with local changes' if dirty.stdout.strip() else ''})"


def _fmt_p(p: float | None) -> str:
    return "-" if p is None else f"{p:.2f}"


def format_summary(
    cmp: Comparison,
    packages: Sequence[dict[str, Any]],
    rules: dict[str, dict[str, Any]],
    *,
    list_findings: bool = True,
    runtime: float | None = None,
    provenance: str = "",
) -> str:
    pairs = cmp.verdict_of()
    out: list[str] = []
    if list_findings:
        for rec in cmp.new:
            out.append(
                f"NEW  {rec['package']} {rec['path']}:{rec['line']}: {rec['code']} {rec['message']}"
            )
        for e in cmp.gone:
            out.append(
                f"GONE {e['package']} {e['path']}:{e.get('line', '?')}: {e['code']} "
                f"[{e['verdict']}] {e['text']}"
            )
        if out:
            out.append("")
    if provenance:
        out.append(provenance)
        out.append("")
    head = ("rule", "name", "default", "findings", *VERDICTS, "precision")
    rows = []
    for code, c in sorted(tally(pairs, "code").items()):
        info = rules.get(code, {"name": "?", "default": False})
        rows.append(
            (
                code,
                info["name"],
                "on" if info["default"] else "off",
                c["findings"],
                *(c[v] for v in VERDICTS),
                _fmt_p(precision(c)),
            )
        )
    tot = Counter(v for _, v in pairs)
    all_counts = {"findings": len(pairs), **{v: tot[v] for v in VERDICTS}}
    rows.append(
        ("total", "", "", len(pairs), *(tot[v] for v in VERDICTS), _fmt_p(precision(all_counts)))
    )
    out.extend(_table(head, rows))
    out.append("")
    head2 = (
        "package",
        "version",
        "artifact",
        "files",
        "seconds",
        "findings",
        *VERDICTS,
        "precision",
    )
    per_pkg = tally(pairs, "package")
    rows2 = []
    for p in packages:
        c = per_pkg.get(p["name"], dict.fromkeys(("findings", *VERDICTS), 0))
        rows2.append(
            (
                p["name"],
                p["version"],
                p["artifact"],
                p["files"],
                f"{p['seconds']:.1f}",
                c["findings"],
                *(c[v] for v in VERDICTS),
                _fmt_p(precision(c)),
            )
        )
    rows2.append(
        (
            "total",
            "",
            "",
            sum(p["files"] for p in packages),
            f"{sum(p['seconds'] for p in packages):.1f}",
            len(pairs),
            *(tot[v] for v in VERDICTS),
            _fmt_p(precision(all_counts)),
        )
    )
    out.extend(_table(head2, rows2))
    out.append("")
    out.append(
        f"{len(cmp.new)} new, {len(cmp.gone)} gone"
        + (f"; linted in {runtime:.1f}s" if runtime is not None else "")
    )
    return "\n".join(out) + "\n"


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in head]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    numeric = [
        i
        for i in range(len(head))
        if all(r[i].replace(".", "").replace("-", "").isdigit() for r in cells[1:] if r[i])
    ]
    lines = []
    for r in cells:
        lines.append(
            "  ".join(
                c.rjust(w) if i in numeric else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    return lines


def summary_json(
    cmp: Comparison,
    packages: Sequence[dict[str, Any]],
    rules: dict[str, dict[str, Any]],
    failures: list[str],
    runtime: float | None,
) -> dict[str, Any]:
    pairs = cmp.verdict_of()
    per_rule = {
        code: {**c, "precision": precision(c), "default": rules.get(code, {}).get("default")}
        for code, c in sorted(tally(pairs, "code").items())
    }
    per_pkg = tally(pairs, "package")
    return {
        "rules": per_rule,
        "packages": [{**p, **per_pkg.get(p["name"], {"findings": 0})} for p in packages],
        "new": cmp.new,
        "gone": cmp.gone,
        "check_failures": failures,
        "runtime_s": runtime,
        "trainlint": trainlint_provenance(),
    }


# --------------------------------------------------------------------------- main


def run(
    pkgs: Sequence[Package],
    *,
    cache: Path,
    select: str | None,
    jobs: int | None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Lint each package; (findings as records, per-package info)."""
    records: list[dict[str, Any]] = []
    info: list[dict[str, Any]] = []
    for pkg in pkgs:
        start = time.perf_counter()
        root = ensure_unpacked(pkg, cache)
        files = python_files(root, pkg.exclude)
        raw = lint_package(root, files, select=select, jobs=jobs)
        recs = findings_to_records(pkg.name, pkg.version, root, raw)
        records.extend(recs)
        elapsed = time.perf_counter() - start
        info.append(
            {
                "name": pkg.name,
                "version": pkg.version,
                "artifact": pkg.artifact,
                "files": len(files),
                "seconds": round(elapsed, 2),
            }
        )
        if progress:
            print(
                f"  {pkg.name:<28} {len(files):>4} files {len(recs):>4} findings {elapsed:5.1f}s",
                file=sys.stderr,
            )
    return records, info


def pin(spec: str, artifact: str) -> str:
    """A packages.toml entry for NAME==VERSION, looked up on the simple index."""
    name, _, version = spec.partition("==")
    if not version:
        raise SystemExit("--pin takes NAME==VERSION")
    files = [f for f in simple_index_files(name) if not f.get("yanked")]
    stem = f"{name.lower().replace('-', '_').replace('.', '_')}_{version.lower()}"

    def wanted(fname: str) -> bool:
        flat = fname.lower().replace("-", "_")
        if artifact == "wheel":
            return flat.startswith(stem + "_") and flat.endswith("_none_any.whl")
        return flat in (stem + ".tar.gz", stem + ".zip")

    matches = [f for f in files if wanted(f["filename"])]
    if not matches:
        raise SystemExit(f"{name}: no {artifact} for version {version} on {SIMPLE_INDEX}")
    f = matches[0]
    return (
        f'[[package]]\nname = "{name}"\nversion = "{version}"\nartifact = "{artifact}"\n'
        f'filename = "{f["filename"]}"\nsha256 = "{f["hashes"]["sha256"]}"\n'
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Lint pinned training packages and compare with the reviewed ledger."
    )
    parser.add_argument("--packages", help="comma-separated package names (default: all pinned)")
    parser.add_argument(
        "--select", help="passed to `trainlint check --select` (default: the default rules)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="write NEW findings to the ledger as unreviewed (keeps GONE ones)",
    )
    parser.add_argument("--prune", action="store_true", help="with --update: drop GONE entries")
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a default rule is below 0.9 precision, a finding is "
        "unreviewed, or a true finding is gone",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="counts only: do not list NEW and GONE findings"
    )
    parser.add_argument("--jobs", type=int, help="passed to `trainlint check --jobs`")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=CACHE_DIR,
        help=f"downloads and unpacked sources (default {CACHE_DIR})",
    )
    parser.add_argument("--packages-file", type=Path, default=PACKAGES_FILE)
    parser.add_argument("--ledger", type=Path, default=LEDGER_FILE)
    parser.add_argument(
        "--pin",
        metavar="NAME==VERSION",
        help="print a packages.toml entry for this release and exit",
    )
    parser.add_argument(
        "--artifact",
        choices=("sdist", "wheel"),
        default="sdist",
        help="with --pin: which artifact to pin (default sdist)",
    )
    args = parser.parse_args(argv)
    if args.prune and not args.update:
        parser.error("--prune only works with --update")
    if args.pin:
        print(pin(args.pin, args.artifact), end="")
        return 0

    pkgs = load_packages(args.packages_file)
    if args.packages:
        wanted = [n.strip() for n in args.packages.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {p.name for p in pkgs})
        if unknown:
            parser.error(f"not in {args.packages_file.name}: {', '.join(unknown)}")
        pkgs = [p for p in pkgs if p.name in wanted]

    rules = rule_table()
    codes = selected_codes(rules, args.select)
    start = time.perf_counter()
    records, info = run(
        pkgs, cache=args.cache_dir, select=args.select, jobs=args.jobs, progress=not args.json
    )
    runtime = time.perf_counter() - start
    codes |= {r["code"] for r in records}
    cmp = compare(records, read_ledger(args.ledger), packages={p.name for p in pkgs}, codes=codes)
    failures = gate_failures(cmp, {c for c, r in rules.items() if r["default"]})

    if args.json:
        print(json.dumps(summary_json(cmp, info, rules, failures, runtime), indent=2))
    else:
        print(
            format_summary(
                cmp,
                info,
                rules,
                list_findings=not args.quiet,
                runtime=runtime,
                provenance=trainlint_provenance(),
            ),
            end="",
        )
    if args.update:
        write_ledger(updated_ledger(cmp, prune=args.prune), args.ledger)
        if not args.json:
            print(
                f"ledger updated: {len(cmp.new)} added"
                + (f", {len(cmp.gone)} pruned" if args.prune else "")
            )
    if args.check:
        for msg in failures:
            print(f"check failed: {msg}", file=sys.stderr)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
