"""Ecosystem check: lint pinned real-world training packages, compare with a reviewed ledger.

    python bench/ecosystem.py                      # lint all, compare, print the summary
    python bench/ecosystem.py --packages trl,timm  # only these packages
    python bench/ecosystem.py --select TL4         # passed through to ``trainlint check``
    python bench/ecosystem.py --update [--prune]   # write new findings as unreviewed
    python bench/ecosystem.py --check              # exit 1 on a failing gate (see below)
    python bench/ecosystem.py --json               # machine-readable summary on stdout
    python bench/ecosystem.py --migrate            # fill ``template``/``context`` in old entries
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

Findings are matched to ``bench/ecosystem/ledger.jsonl`` the way every corpus is
(``bench/corpus.py`` holds the shared part and its docstring the rules): the key is
(package, path, code, flagged line, message template); a line repeated in a file pairs
by its surrounding lines, then by occurrence; a version bump keeps a verdict only where
the lines around the finding did not change. Precision per rule is
true / (true + false + noise) over the findings produced now.

``--check`` exits 1 when a default-enabled rule is below 0.9 precision, when any
finding produced now is unreviewed (NEW or re-opened), or when a finding reviewed as
true is GONE and no valid ``opt_in`` option brings it back. It needs the downloads, so
it is not part of ``.ci/run``; ``tests/test_ecosystem_tool.py`` and
``tests/test_corpus.py`` cover it offline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import corpus  # noqa: E402  (bench/ is not a package: the shared module sits beside this one)

DATA = HERE / "ecosystem"
PACKAGES_FILE = DATA / "packages.toml"
LEDGER_FILE = DATA / "ledger.jsonl"
CACHE_DIR = HERE / ".ecosystem-cache"
SIMPLE_INDEX = "https://pypi.org/simple"
SCHEMA = corpus.ECOSYSTEM


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
        out.append(Package(
            name=entry["name"], version=entry["version"], artifact=entry["artifact"],
            filename=entry["filename"], sha256=entry["sha256"],
            exclude=tuple(entry.get("exclude", ())), note=entry.get("note", ""),
        ))
    names = [p.name for p in out]
    dupes = sorted(n for n, c in Counter(names).items() if c > 1)
    if dupes:
        raise SystemExit(f"{path}: packages listed twice: {', '.join(dupes)}")
    return out


def simple_index_files(name: str) -> list[dict[str, Any]]:
    """The files PyPI lists for a project (PEP 691 JSON), as pip sees them."""
    req = urllib.request.Request(
        f"{SIMPLE_INDEX}/{name}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json",
                 "User-Agent": "trainlint-ecosystem-check"},
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
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(files[0]["url"], timeout=600) as resp:
            shutil.copyfileobj(resp, out)
        digest = _sha256(Path(tmp))
        if digest != pkg.sha256:
            raise RuntimeError(f"{pkg.filename}: sha256 {digest} does not match the pin {pkg.sha256}")
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
    corpus.write_config_stop(cache / "src")
    if (root / ".ecosystem-complete").is_file():
        return root
    archive = download(pkg, cache / "downloads")
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{pkg.key}-"))
    try:
        _extract(archive, tmp)
        entries = list(tmp.iterdir())
        # An sdist has exactly one top folder (name-version/): paths are relative to it.
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() and pkg.artifact == "sdist" else tmp
        (top / ".ecosystem-complete").write_text(f"{pkg.filename} {pkg.sha256}\n", encoding="utf-8")
        if root.exists():
            shutil.rmtree(root)
        os.replace(top, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


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


# --------------------------------------------------------------------------- main


def run(pkgs: Sequence[Package], *, cache: Path, select: str | None, jobs: int | None,
        progress: bool = True) -> corpus.Run:
    """Lint each package: its findings as records, and per-package info."""
    records: list[dict[str, Any]] = []
    info: list[dict[str, Any]] = []
    roots: dict[str, Path] = {}
    begin = time.perf_counter()
    for pkg in pkgs:
        start = time.perf_counter()
        root = roots[pkg.name] = ensure_unpacked(pkg, cache)
        files = corpus.python_files(root, pkg.exclude)
        raw = corpus.lint_tree(root, files, select=select, jobs=jobs)
        recs = corpus.to_records(SCHEMA, pkg.name, pkg.version, root, raw)
        records.extend(recs)
        elapsed = time.perf_counter() - start
        info.append({"name": pkg.name, "version": pkg.version, "artifact": pkg.artifact,
                     "files": len(files), "seconds": round(elapsed, 2)})
        if progress:
            print(f"  {pkg.name:<28} {len(files):>4} files {len(recs):>4} findings {elapsed:5.1f}s",
                  file=sys.stderr)
    return corpus.Run(SCHEMA, records, info, roots, time.perf_counter() - begin)


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
    return (f'[[package]]\nname = "{name}"\nversion = "{version}"\nartifact = "{artifact}"\n'
            f'filename = "{f["filename"]}"\nsha256 = "{f["hashes"]["sha256"]}"\n')


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Lint pinned training packages and compare with the reviewed ledger.")
    parser.add_argument("--packages", help="comma-separated package names (default: all pinned)")
    corpus.add_ledger_args(parser)
    parser.add_argument("--migrate", action="store_true",
                        help="fill `template` and `context` in entries written before they existed")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                        help=f"downloads and unpacked sources (default {CACHE_DIR})")
    parser.add_argument("--packages-file", type=Path, default=PACKAGES_FILE)
    parser.add_argument("--ledger", type=Path, default=LEDGER_FILE)
    parser.add_argument("--pin", metavar="NAME==VERSION",
                        help="print a packages.toml entry for this release and exit")
    parser.add_argument("--artifact", choices=("sdist", "wheel"), default="sdist",
                        help="with --pin: which artifact to pin (default sdist)")
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
    result = run(pkgs, cache=args.cache_dir, select=args.select, jobs=args.jobs,
                 progress=not args.json)
    return corpus.finish(result, args, ledger_path=args.ledger, columns=("version", "artifact"),
                         sources_key="packages")


if __name__ == "__main__":
    sys.exit(main())
