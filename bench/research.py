"""Research corpus check: lint pinned GitHub training repositories, compare with a reviewed ledger.

    python bench/research.py --mirror DIR          # lint all, compare, print the summary
    python bench/research.py --repos a/b,c/d       # only these repositories
    python bench/research.py --update [--prune]    # write new findings as unreviewed
    python bench/research.py --check               # exit 1 on a failing gate
    python bench/research.py --json                # machine-readable summary on stdout

The repositories are pinned (``owner/name`` at a 40-hex commit) in
``bench/research/repos.toml``. Each is read from ``--mirror DIR`` (default: the
``TRAINLINT_MIRROR`` environment variable), where ``DIR/owner+name/repo`` is a bare git
directory holding the commit; without a mirror the repository is cloned from GitHub
once into the cache. The commit's tree is extracted with ``git archive`` into the
ignored ``bench/.corpus-cache/owner+name@sha12/`` (later runs reuse it), next to an
empty ``trainlint.toml`` that stops config discovery above the trees.

Every ``*.py`` file is linted except the vendored folders every corpus skips and the
repository's ``exclude`` globs, with trainlint's default selection (or ``--select``).
``torch_pin`` is informational: trainlint reads each repository's own torch pin
(``requirements*.txt``, ``setup.py``, ...) as it would for a user.

Findings are compared with ``bench/research/ledger.jsonl`` as every corpus is: see
``bench/corpus.py`` for the key, the pairing, the version-bump rule and the gate, and
``bench/research/README.md`` for the verdicts.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
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

DATA = HERE / "research"
REPOS_FILE = DATA / "repos.toml"
LEDGER_FILE = DATA / "ledger.jsonl"
CACHE_DIR = HERE / ".corpus-cache"
SCHEMA = corpus.RESEARCH
_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class Repo:
    name: str  # owner/name
    commit: str
    area: str = ""
    exclude: tuple[str, ...] = ()
    torch_pin: str = ""
    note: str = ""


def load_repos(path: Path = REPOS_FILE) -> list[Repo]:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    out = []
    for n, entry in enumerate(data.get("repo", []), 1):
        name, commit = entry.get("name", ""), entry.get("commit", "")
        if name.count("/") != 1 or not _SHA.fullmatch(commit):
            raise SystemExit(f"{path}: repo #{n} needs `name = \"owner/name\"` and a 40-hex `commit`")
        out.append(Repo(name=name, commit=commit, area=entry.get("area", ""),
                        exclude=tuple(entry.get("exclude", ())),
                        torch_pin=str(entry.get("torch_pin", "") or ""), note=entry.get("note", "")))
    dupes = sorted(n for n, c in Counter(r.name for r in out).items() if c > 1)
    if dupes:
        raise SystemExit(f"{path}: repositories listed twice: {', '.join(dupes)}")
    return out


def default_mirror() -> Path | None:
    value = os.environ.get("TRAINLINT_MIRROR")
    return Path(value) if value else None


def run(repos: Sequence[Repo], *, sources: corpus.GitSources, select: str | None,
        jobs: int | None, progress: bool = True) -> corpus.Run:
    """Lint each repository at its commit: its findings as records, and per-repo info."""
    records: list[dict[str, Any]] = []
    info: list[dict[str, Any]] = []
    roots: dict[str, Path] = {}
    begin = time.perf_counter()
    for repo in repos:
        start = time.perf_counter()
        try:
            root = roots[repo.name] = sources.tree(repo.name, repo.commit)
        except (RuntimeError, OSError) as exc:
            # One repository missing from the mirror must not hide the others' results;
            # its ledger entries stay untouched and --check fails on it.
            info.append({"name": repo.name, "commit": repo.commit, "short": repo.commit[:12],
                         "area": repo.area, "files": 0, "seconds": 0.0, "error": str(exc)})
            if progress:
                print(f"  {repo.name:<44} not read: {exc}", file=sys.stderr)
            continue
        files = corpus.python_files(root, repo.exclude, notebooks=True)
        raw = corpus.lint_tree(root, files, select=select, jobs=jobs)
        recs = corpus.to_records(SCHEMA, repo.name, repo.commit, root, raw)
        records.extend(recs)
        elapsed = time.perf_counter() - start
        info.append({"name": repo.name, "commit": repo.commit, "short": repo.commit[:12],
                     "area": repo.area, "files": len(files), "seconds": round(elapsed, 2)})
        if progress:
            print(f"  {repo.name:<44} {len(files):>4} files {len(recs):>4} findings {elapsed:5.1f}s",
                  file=sys.stderr)
    return corpus.Run(SCHEMA, records, info, roots, time.perf_counter() - begin)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Lint pinned research training repositories and compare with the reviewed ledger.")
    parser.add_argument("--repos", help="comma-separated owner/name (default: all pinned)")
    corpus.add_ledger_args(parser)
    parser.add_argument("--mirror", type=Path, default=default_mirror(),
                        help="folder of owner+name/repo bare git directories "
                             "(default: $TRAINLINT_MIRROR; without one, clone from GitHub)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR,
                        help=f"extracted trees (default {CACHE_DIR})")
    parser.add_argument("--repos-file", type=Path, default=REPOS_FILE)
    parser.add_argument("--ledger", type=Path, default=LEDGER_FILE)
    args = parser.parse_args(argv)
    if args.prune and not args.update:
        parser.error("--prune only works with --update")

    repos = load_repos(args.repos_file)
    if args.repos:
        wanted = [n.strip() for n in args.repos.split(",") if n.strip()]
        unknown = sorted(set(wanted) - {r.name for r in repos})
        if unknown:
            parser.error(f"not in {args.repos_file.name}: {', '.join(unknown)}")
        repos = [r for r in repos if r.name in wanted]
    sources = corpus.GitSources(args.cache_dir, args.mirror)
    result = run(repos, sources=sources, select=args.select, jobs=args.jobs, progress=not args.json)
    return corpus.finish(result, args, ledger_path=args.ledger, columns=("short", "area"),
                         sources_key="repos")


if __name__ == "__main__":
    sys.exit(main())
