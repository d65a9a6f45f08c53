"""What the three corpus checks share: sources, linting, the ledger, the comparison, the gate.

``bench/ecosystem.py`` (PyPI packages), ``bench/research.py`` (research training repos
on GitHub) and ``bench/bugs.py`` (confirmed bugs) are thin front ends over this module.

    python bench/corpus.py --report     # per rule, across the ecosystem and research ledgers

**Records.** A finding is a dict shaped like a ledger entry: the corpus's source field
and pin field (``package``/``version`` for the ecosystem, ``repo``/``commit`` for the
research corpus: see :class:`Schema`), ``path``, ``line``, ``code``, ``text`` (the
flagged line, whitespace collapsed), ``message``, ``template`` (the message with its
variable parts masked) and ``context`` (a hash of the lines around the flagged one).

**The match key** is (source, path, code, text, template). ``template`` masks, in this
order, backquoted spans (`` `x.item()` `` -> `` `_` ``), quoted strings that do not sit
inside a word (so "batch's" stays) and numbers (``2.6`` -> ``#``): a rewording of the
fixed part of a message changes the key (re-review), a different variable name does not.

**Pairing within one key** (a line repeated in a file): first entries whose ``context``
equals the finding's (the same place in the file), in line order; then, by occurrence
order, entries written at another pin (a version or commit bump): the finding takes the
entry but its verdict is re-opened (``unreviewed``), since the lines around it changed.
An entry at the current pin whose context no longer matches is a different place: it is
GONE, even when an identical line fires elsewhere in the file, and the finding is NEW.
Entries without ``context`` (written before it existed) pair by occurrence order.

**The gate** (``--check``) fails on: any finding produced now that is unreviewed (NEW,
or re-opened); a default-enabled rule below 0.9 precision; an entry reviewed as true
that is GONE, unless its ``opt_in`` names a real option of its rule
(``TL401.allow-loss-item = false``), or is the bare code of a rule that is off by
default (``TL401``: the rule selected, as ``--extend-select TL401`` would), and a re-lint
of that source with the option set (or the rule selected) reports the finding again; an
``opt_in`` that does not parse or names no such option.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
VERDICTS = ("true", "false", "noise", "unreviewed")
PRECISION_GATE = 0.9
#: Lines on either side of the flagged one that ``context`` hashes.
CONTEXT_RADIUS = 3
#: Folders never linted: other projects' code copied in, and build leftovers.
SKIP_DIRS = frozenset({
    "__pycache__", ".git", ".hg", ".tox", ".venv", "node_modules",
    "third_party", "thirdparty", "third-party", "vendor", "_vendor", "vendored",
})
CONFIG_STOP_TEXT = (
    "# Empty on purpose: config discovery for the linted sources stops here, so\n"
    "# they are linted with trainlint's defaults, not this repository's settings.\n"
)


@dataclass(frozen=True)
class Schema:
    """How one corpus names its source and pin in records and in its ledger."""

    source: str  # "package" or "repo"
    pin: str  # "version" or "commit"

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields of a ledger entry, in the order they are written."""
        return (self.source, self.pin, "path", "line", "code", "text", "message", "template",
                "context", "verdict", "reason")


ECOSYSTEM = Schema("package", "version")
RESEARCH = Schema("repo", "commit")


# --------------------------------------------------------------------------- text


_BACKQUOTED = re.compile(r"`[^`]*`")
_QUOTED = re.compile(r"""(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)"[^"\n]*"(?!\w)""")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)*(?![\w.])|(?<![\w.])\d+(?:\.\d+)*(?=\.(?:\s|$))")


def normalise(line: str) -> str:
    """The flagged source line as the match key holds it: whitespace collapsed."""
    return " ".join(line.split())


def template(message: str) -> str:
    """The message with its variable parts masked (see the module docstring)."""
    out = _BACKQUOTED.sub("`_`", message)
    out = _QUOTED.sub("'_'", out)
    return _NUMBER.sub("#", out)


def context_hash(lines: Sequence[str], line: int, radius: int = CONTEXT_RADIUS) -> str:
    """A short hash of lines ``line - radius .. line + radius`` (1-based), trailing
    whitespace dropped: any edit there, indentation included, changes it."""
    lo, hi = max(1, line - radius), min(len(lines), line + radius)
    window = "\n".join(lines[i - 1].rstrip() for i in range(lo, hi + 1))
    return hashlib.sha1(f"{line - lo}\n{window}".encode()).hexdigest()[:12]


class SourceLines:
    """A tree's files as lists of lines, read once each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files: dict[str, list[str]] = {}

    def lines(self, rel: str) -> list[str]:
        """The lines of a file, or of one notebook cell (``nb.ipynb:cell 3``, trainlint's
        own notation: a notebook finding's line is within its cell)."""
        if rel not in self._files:
            path, _, cell = rel.partition(":cell ")
            try:
                text = (self.root / path).read_text(encoding="utf-8", errors="replace")
                if cell:
                    source = json.loads(text)["cells"][int(cell) - 1].get("source", "")
                    text = "".join(source) if isinstance(source, list) else str(source)
            except (OSError, ValueError, LookupError, TypeError, AttributeError):
                text = ""
            self._files[rel] = text.splitlines()
        return self._files[rel]

    def line(self, rel: str, line: int) -> str:
        lines = self.lines(rel)
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def context(self, rel: str, line: int) -> str:
        return context_hash(self.lines(rel), line)


# --------------------------------------------------------------------------- files


def python_files(root: Path, exclude: Iterable[str] = (), *, notebooks: bool = False) -> list[str]:
    """``*.py`` files (with ``notebooks``, also ``*.ipynb``, as ``trainlint check .`` reads
    them) under root, as sorted posix paths relative to it."""
    suffixes = (".py", ".ipynb") if notebooks else (".py",)
    patterns = list(exclude)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(
            d for d in dirnames
            if d not in SKIP_DIRS and not d.endswith(".egg-info")
            and not excluded(rel_dir + d, patterns)
        )
        for fname in filenames:
            rel = rel_dir + fname
            if fname.endswith(suffixes) and not excluded(rel, patterns):
                out.append(rel)
    return sorted(out)


def excluded(rel: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(rel, p.rstrip("/") + "/*")
               for p in patterns)


def write_config_stop(directory: Path) -> None:
    """An empty ``trainlint.toml``: config discovery above the linted trees stops here."""
    directory.mkdir(parents=True, exist_ok=True)
    stop = directory / "trainlint.toml"
    if not stop.exists():
        stop.write_text(CONFIG_STOP_TEXT, encoding="utf-8")


# --------------------------------------------------------------------------- git sources


def mirror_git_dir(mirror: Path, repo: str) -> Path:
    """Where a mirror keeps ``owner/name``: ``MIRROR/owner+name/repo``, a bare git
    directory, or a repository whose git directory is ``repo/.git``."""
    where = mirror / repo.replace("/", "+") / "repo"
    return where / ".git" if (where / ".git").is_dir() else where


class GitSources:
    """Repositories at pinned commits: read from a mirror of bare git directories, or
    cloned from GitHub into the cache when no mirror is given."""

    def __init__(self, cache: Path, mirror: Path | None) -> None:
        self.cache = cache
        self.mirror = mirror

    def git_dir(self, repo: str) -> Path:
        if self.mirror is not None:
            return mirror_git_dir(self.mirror, repo)
        target = self.cache / "git" / (repo.replace("/", "+") + ".git")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".part")
            shutil.rmtree(tmp, ignore_errors=True)
            _git(["clone", "--bare", "--quiet", f"https://github.com/{repo}.git", str(tmp)])
            os.replace(tmp, target)
        return target

    def has_commit(self, repo: str, commit: str) -> bool:
        git_dir = self.git_dir(repo)
        if not git_dir.is_dir():
            return False
        proc = subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{commit}^{{commit}}"],
                              capture_output=True, check=False)
        return proc.returncode == 0

    def show(self, repo: str, commit: str, path: str) -> str | None:
        """A file's text at a commit, or None when it is not there."""
        proc = subprocess.run(["git", "--git-dir", str(self.git_dir(repo)), "show", f"{commit}:{path}"],
                              capture_output=True, check=False)
        return proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None

    def tree(self, repo: str, commit: str) -> Path:
        """The repository's files at ``commit``, extracted once (``git archive``) under
        ``CACHE/owner+name@sha12/``; a half-extracted tree is never trusted."""
        root = self.cache / f"{repo.replace('/', '+')}@{commit[:12]}"
        write_config_stop(self.cache)
        if (root / ".corpus-complete").is_file():
            return root
        git_dir = self.git_dir(repo)
        if not self.has_commit(repo, commit):
            raise RuntimeError(f"{repo}: commit {commit} is not in {git_dir}")
        tmp = Path(tempfile.mkdtemp(dir=self.cache, prefix=f".{root.name}-"))
        try:
            archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "--format=tar", commit],
                                     capture_output=True, check=False)
            missing: list[str] = []
            if archive.returncode == 0:
                subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
            else:
                # A mirror may lack some blobs (snapshots drop very large files): take the
                # files it has, and say which are missing.
                missing = _extract_blobs(git_dir, commit, tmp)
            (tmp / ".corpus-complete").write_text(
                f"{repo}@{commit}\n" + "".join(f"missing {m}\n" for m in missing), encoding="utf-8")
            if root.exists():
                shutil.rmtree(root)
            os.replace(tmp, root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return root


def _extract_blobs(git_dir: Path, commit: str, dest: Path) -> list[str]:
    """Write the commit's regular files that the git directory holds under ``dest``; the
    paths whose blobs are absent, sorted."""
    git = ["git", "--git-dir", str(git_dir)]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", "--full-tree", commit],
                             capture_output=True, check=True).stdout
    files: dict[str, str] = {}  # path -> blob
    for item in listing.split(b"\0"):
        if not item:
            continue
        meta, _, raw_path = item.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        if kind == "blob" and mode in ("100644", "100755"):  # not links, not submodules
            files[raw_path.decode("utf-8", errors="surrogateescape")] = sha
    check = subprocess.run([*git, "cat-file", "--batch-check"], capture_output=True, check=True,
                           input="".join(f"{sha}\n" for sha in files.values()).encode()).stdout
    present = {line.split()[0] for line in check.decode().splitlines() if not line.endswith("missing")}
    missing = sorted(p for p, sha in files.items() if sha not in present)
    wanted = [(p, sha) for p, sha in files.items() if sha in present]
    blobs = subprocess.run([*git, "cat-file", "--batch"], capture_output=True, check=True,
                           input="".join(f"{sha}\n" for _, sha in wanted).encode()).stdout
    pos = 0
    for path, _ in wanted:
        header_end = blobs.index(b"\n", pos)
        size = int(blobs[pos:header_end].split()[2])
        target = dest / path
        if not target.resolve().is_relative_to(dest.resolve()):
            raise RuntimeError(f"{commit}: path escapes the tree: {path}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blobs[header_end + 1:header_end + 1 + size])
        pos = header_end + 1 + size + 1
    return missing


def _git(args: Sequence[str]) -> None:
    proc = subprocess.run(["git", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")


# --------------------------------------------------------------------------- linting


def lint_tree(root: Path, files: Sequence[str], *, select: str | None = None,
              extend_select: str | None = None, jobs: int | None = None,
              config: Path | None = None) -> list[dict[str, Any]]:
    """Raw findings (trainlint's JSON objects) for ``files`` under ``root``, from the CLI."""
    if not files:
        return []
    cmd = [sys.executable, "-m", "trainlint", "check", "--output-format", "json",
           "--no-cache", "--exit-zero"]
    for flag, value in (("--select", select), ("--extend-select", extend_select),
                        ("--jobs", jobs), ("--config", config)):
        if value:
            cmd += [flag, str(value)]
    cmd += ["--", *files]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"trainlint failed in {root} (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return list(json.loads(proc.stdout or "[]"))


def to_records(schema: Schema, source: str, pin: str, root: Path,
               raw: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ledger-shaped records (verdict not yet known) for the CLI's findings."""
    lines = SourceLines(root)
    out = []
    for f in raw:
        path = Path(f["path"])
        rel = (path.relative_to(root) if path.is_absolute() and path.is_relative_to(root) else path).as_posix()
        if f.get("cell"):
            rel = f"{rel}:cell {f['cell']}"
        line = int(f.get("line") or 0)
        message = f.get("message", "")
        out.append({
            schema.source: source, schema.pin: pin, "path": rel, "line": line, "code": f["code"],
            "text": normalise(lines.line(rel, line)), "message": message,
            "template": template(message), "context": lines.context(rel, line),
        })
    out.sort(key=lambda r: (r["path"], r["line"], r["code"], r["message"]))
    return out


# --------------------------------------------------------------------------- the ledger


def match_key(schema: Schema, rec: dict[str, Any]) -> tuple[str, str, str, str, str]:
    tmpl = rec["template"] if "template" in rec else template(rec.get("message", ""))
    return (rec[schema.source], rec["path"], rec["code"], rec["text"], tmpl)


def read_ledger(path: Path, schema: Schema) -> list[dict[str, Any]]:
    """The ledger's entries (one written before ``template`` existed is keyed on the
    template of its own ``message``: see :func:`migrate`)."""
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
        missing = [k for k in (schema.source, "path", "code", "text", "verdict") if k not in entry]
        if missing:
            raise SystemExit(f"{path}:{n}: missing {', '.join(missing)}")
        if entry["verdict"] not in VERDICTS:
            raise SystemExit(f"{path}:{n}: verdict must be one of {', '.join(VERDICTS)}")
        out.append(entry)
    return out


def write_ledger(entries: Iterable[dict[str, Any]], path: Path, schema: Schema) -> None:
    ordered = sorted(entries, key=lambda e: (e[schema.source], e["path"], e.get("line", 0),
                                             e["code"], e["text"]))
    lines = []
    for e in ordered:
        row = {k: e.get(k, "") for k in schema.fields}
        row.update({k: v for k, v in e.items() if k not in row})  # keep extra fields
        lines.append(json.dumps(row, ensure_ascii=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def migrate(entries: Iterable[dict[str, Any]], schema: Schema, roots: dict[str, Path],
            current: Sequence[dict[str, Any]],
            opt_in_current: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """Entries written before ``template`` and ``context`` existed, given both.

    Such an entry was matched on (source, path, code, text) alone, and its stored
    ``message`` may predate a rewording that kept its review: it takes the template,
    context and line of the finding it pairs with under that old key (line order, the
    nearest first), and only when none does, the template of its own message and the
    context at its own line. An entry with an ``opt_in`` pairs first with
    ``opt_in_current``, the findings its option reports. A bare ``opt_in`` is qualified
    with its rule's code.
    """
    old_key = (lambda r: (r[schema.source], r["path"], r["code"], r["text"]))  # noqa: E731
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    by_opt_key: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in current:
        by_key[old_key(rec)].append(rec)
    for rec in opt_in_current:
        by_opt_key[old_key(rec)].append(rec)
    readers = {src: SourceLines(root) for src, root in roots.items()}
    out = []
    for e in sorted(entries, key=lambda e: e.get("line", 0)):
        e = dict(e)
        if "template" not in e:
            pool = by_key.get(old_key(e), [])
            if e.get("opt_in") and by_opt_key.get(old_key(e)):
                pool = by_opt_key[old_key(e)]
            if pool:
                rec = min(pool, key=lambda r: abs(r["line"] - e.get("line", 0)))
                pool.remove(rec)
                e.update(line=rec["line"], message=rec["message"], template=rec["template"],
                         context=rec["context"])
            else:
                e["template"] = template(e.get("message", ""))
        reader = readers.get(e[schema.source])
        if not e.get("context") and reader is not None and e.get("line"):
            e["context"] = reader.context(e["path"], int(e["line"]))
        opt = e.get("opt_in")
        if opt and not re.match(r"TL\d{3}\.", opt):
            e["opt_in"] = f"{e['code']}.{opt}"
        out.append(e)
    return out


# --------------------------------------------------------------------------- compare


@dataclass
class Comparison:
    schema: Schema
    #: (current finding, its ledger entry): the review still holds.
    matched: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    #: (current finding, its ledger entry): same key, written at another pin, the lines
    #: around it changed: the verdict is re-opened.
    reopened: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    new: list[dict[str, Any]] = field(default_factory=list)
    gone: list[dict[str, Any]] = field(default_factory=list)
    #: ledger entries outside this run's sources or rules, kept as they are.
    untouched: list[dict[str, Any]] = field(default_factory=list)

    def verdict_of(self) -> list[tuple[dict[str, Any], str]]:
        """Every finding produced now with its verdict (NEW and re-opened: unreviewed)."""
        return ([(cur, entry["verdict"]) for cur, entry in self.matched]
                + [(cur, "unreviewed") for cur, _ in self.reopened]
                + [(cur, "unreviewed") for cur in self.new])


def compare(schema: Schema, current: Sequence[dict[str, Any]], ledger: Sequence[dict[str, Any]], *,
            pins: dict[str, str], codes: set[str] | None) -> Comparison:
    """Pair findings with ledger entries (see the module docstring).

    ``pins``: each source linted now -> its current pin. Only ledger entries of those
    sources whose code is in ``codes`` (None: any code) can be GONE; the rest are untouched.
    """
    result = Comparison(schema)
    in_scope: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for entry in ledger:
        if entry[schema.source] in pins and (codes is None or entry["code"] in codes):
            in_scope[match_key(schema, entry)].append(entry)
        else:
            result.untouched.append(entry)
    by_key: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in current:
        by_key[match_key(schema, rec)].append(rec)
    for key in sorted(set(by_key) | set(in_scope)):
        _pair(result, sorted(by_key.get(key, []), key=lambda r: r["line"]),
              sorted(in_scope.get(key, []), key=lambda e: e.get("line", 0)), pins[key[0]])
    def order(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r[schema.source], r["path"], r.get("line", 0), r["code"])

    result.new.sort(key=order)
    result.gone.sort(key=order)
    return result


def _pair(result: Comparison, recs: list[dict[str, Any]], entries: list[dict[str, Any]],
          pin: str) -> None:
    free = list(entries)
    rest = []
    for rec in recs:
        same_place = next((e for e in free if e.get("context") and e["context"] == rec["context"]), None)
        if same_place is None:
            rest.append(rec)
        else:
            free.remove(same_place)
            result.matched.append((rec, same_place))
    # What is left pairs by occurrence order, except an entry at this very pin that has a
    # context: the sources are the same, so its place no longer fires.
    movable = [e for e in free if not e.get("context") or str(e.get(result.schema.pin, "")) != pin]
    result.gone.extend(e for e in free if not any(e is m for m in movable))
    for rec, entry in zip(rest, movable, strict=False):
        (result.reopened if entry.get("context") else result.matched).append((rec, entry))
    result.new.extend(rest[len(movable):])
    result.gone.extend(movable[len(rest):])


def updated_ledger(cmp: Comparison, *, prune: bool) -> list[dict[str, Any]]:
    """The ledger after ``--update``: reviews kept, pin/line/message/context refreshed,
    re-opened ones marked unreviewed (the old verdict kept in ``reopened``), NEW
    findings added as unreviewed, GONE entries marked ``gone`` (dropped with ``prune``)."""
    s = cmp.schema
    out = list(cmp.untouched)
    refresh = (s.pin, "line", "message", "template", "context")
    def here(entry: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in entry.items() if k != "gone"}

    for cur, entry in cmp.matched:
        out.append({**here(entry), **{k: cur[k] for k in refresh}})
    for cur, entry in cmp.reopened:
        was = f"{entry.get(s.pin, '?')} {entry['verdict']}: {entry.get('reason', '')}"
        out.append({**here(entry), **{k: cur[k] for k in refresh}, "verdict": "unreviewed",
                    "reopened": was})
    # A reworded message changes the key: the new finding is unreviewed, but the review of
    # the same line in the same place is shown next to it, for the reviewer.
    earlier = {(e[s.source], e["path"], e["code"], e["text"], e.get("context")): e for e in cmp.gone}
    for cur in cmp.new:
        row = {**cur, "verdict": "unreviewed", "reason": ""}
        was = earlier.get((cur[s.source], cur["path"], cur["code"], cur["text"], cur["context"]))
        if was is not None:
            row["reopened"] = (f"{was.get(s.pin, '?')} {was['verdict']}: {was.get('reason', '')} "
                               f"(message then: {was.get('message', '')})")
        out.append(row)
    if not prune:
        # Kept for their reviews, marked so that a report from the ledger alone counts
        # only what trainlint reports now.
        out.extend({**e, "gone": True} for e in cmp.gone)
    return out


# --------------------------------------------------------------------------- opt-in


_OPT_IN = re.compile(r"^\s*(TL\d{3})\.([A-Za-z0-9_-]+)\s*=\s*(.+?)\s*$")
_BARE_CODE = re.compile(r"^\s*(TL\d{3})\s*$")
#: The "option" of a bare-code ``opt_in``: the off-by-default rule selected, its options
#: left at their defaults.
SELECT_RULE = ""


def parse_opt_in(text: str, code: str, rules: dict[str, dict[str, Any]]) -> tuple[str, Any] | str:
    """(option, value) from ``TL401.allow-loss-item = false``, or why it is not valid:
    it must name the entry's own rule and an option that rule has. A bare code
    (``TL401``) names a rule that is off by default: (SELECT_RULE, True)."""
    bare = _BARE_CODE.match(text or "")
    if bare is not None:
        if bare.group(1) != code:
            return f"`opt_in` names {bare.group(1)}, but the finding is {code}"
        if rules.get(code, {}).get("default", True):
            return f"`opt_in`: {code} is on by default; name one of its options"
        return SELECT_RULE, True
    m = _OPT_IN.match(text or "")
    if m is None:
        return f"`opt_in = {text!r}` is not of the form `{code}.option = value`"
    rule, option, raw = m.groups()
    if rule != code:
        return f"`opt_in` names {rule}, but the finding is {code}"
    if option not in rules.get(code, {}).get("options", {}):
        return f"`opt_in`: {code} has no option `{option}`"
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return f"`opt_in`: `{raw}` is not a TOML value"
    return option, value


def relint_with_option(schema: Schema, source: str, pin: str, root: Path, paths: Sequence[str],
                       code: str, option: str, value: Any) -> list[dict[str, Any]]:
    """Findings of ``code`` in ``paths`` with the rule option set (a temporary config).
    A path no longer in the tree has no findings."""
    paths = [p for p in paths if (root / p).is_file()]
    if not paths:
        return []
    if option == SELECT_RULE:  # an off-by-default rule, selected with its defaults
        return to_records(schema, source, pin, root, lint_tree(root, sorted(set(paths)), select=code))
    fd, name = tempfile.mkstemp(suffix=".toml", prefix=".opt-in-", dir=root.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"[rules.{code}]\n{json.dumps(option)} = {json.dumps(value)}\n")
        raw = lint_tree(root, sorted(set(paths)), select=code, config=Path(name))
    finally:
        os.unlink(name)
    return to_records(schema, source, pin, root, raw)


def opt_in_failures(cmp: Comparison, rules: dict[str, dict[str, Any]],
                    relint: Callable[..., list[dict[str, Any]]] | None) -> list[str]:
    """Why the GONE true entries that claim an ``opt_in`` do not hold it up.

    ``relint(source, paths, code, option, value)`` lints that source's files with the
    option set; None: nothing can be re-linted, so no claim holds."""
    s = cmp.schema
    groups: dict[tuple[str, str, str, str], list[dict[str, Any]]] = defaultdict(list)
    failures = []
    for e in cmp.gone:
        if e["verdict"] != "true" or not e.get("opt_in"):
            continue
        parsed = parse_opt_in(e["opt_in"], e["code"], rules)
        if isinstance(parsed, str):
            failures.append(f"{e[s.source]} {e['path']}:{e.get('line', '?')}: {parsed}")
            continue
        option, value = parsed
        groups[(e[s.source], e["code"], option, json.dumps(value))].append(e)
    for (source, code, option, value), entries in sorted(groups.items()):
        found: Counter[tuple[str, ...]] = Counter()
        if relint is not None:
            got = relint(source, [e["path"] for e in entries], code, option, json.loads(value))
            found = Counter(match_key(s, r) for r in got)
        for e in entries:
            key = match_key(s, e)
            if found[key] > 0:
                found[key] -= 1
            else:
                failures.append(f"{source} {e['path']}:{e.get('line', '?')}: {code} is GONE and "
                                f"`{e['opt_in']}` does not report it either")
    return failures


# --------------------------------------------------------------------------- the gate


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


def gate_failures(cmp: Comparison, rules: dict[str, dict[str, Any]],
                  relint: Callable[..., list[dict[str, Any]]] | None = None) -> list[str]:
    """Why ``--check`` fails (empty: it passes)."""
    failures = []
    per_rule = tally(cmp.verdict_of(), "code")
    for code, counts in sorted(per_rule.items()):
        p = precision(counts)
        if rules.get(code, {}).get("default") and p is not None and p < PRECISION_GATE:
            failures.append(f"{code}: precision {p:.2f} < {PRECISION_GATE} (default-enabled)")
    unreviewed = sum(c["unreviewed"] for c in per_rule.values())
    if unreviewed:
        failures.append(f"{unreviewed} finding(s) not reviewed (NEW, re-opened, or unreviewed)")
    lost = [e for e in cmp.gone if e["verdict"] == "true" and not e.get("opt_in")]
    if lost:
        failures.append(f"{len(lost)} finding(s) reviewed as true are GONE")
    failures.extend(opt_in_failures(cmp, rules, relint))
    return failures


# --------------------------------------------------------------------------- rules, summaries


def rule_table() -> dict[str, dict[str, Any]]:
    """code -> {name, default, options} from the trainlint that lints."""
    from trainlint.api import all_rules

    return {r.code: {"name": getattr(r, "name", ""), "default": bool(getattr(r, "default_enabled", True)),
                     "options": dict(getattr(r, "options", {}) or {})}
            for r in all_rules()}


def selected_codes(rules: dict[str, dict[str, Any]], select: str | None,
                   extend: Iterable[str] = ()) -> set[str]:
    """The codes a run lints with: the default set (or what ``--select`` prefixes name),
    plus the ``extend`` prefixes."""
    prefixes = [s.strip() for s in (select or "").split(",") if s.strip()]
    if not prefixes:
        chosen = {c for c, r in rules.items() if r["default"]}
    elif any(p.upper() == "ALL" for p in prefixes):
        chosen = set(rules)
    else:
        chosen = {c for c in rules if any(c.startswith(p) for p in prefixes)}
    return chosen | {c for c in rules if any(c.startswith(p) for p in extend)}


def trainlint_provenance() -> str:
    """Which trainlint linted: version and the git commit of its source (if any)."""
    import trainlint

    src = Path(trainlint.__file__).resolve().parent
    version = f"trainlint {getattr(trainlint, '__version__', '?')}"
    try:
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=30, check=False)
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return version
    if head.returncode != 0:
        return version
    return f"{version} (git {head.stdout.strip()}{', with local changes' if dirty.stdout.strip() else ''})"


def fmt_p(p: float | None) -> str:
    return "-" if p is None else f"{p:.2f}"


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in head]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    numeric = [i for i in range(len(head)) if all(r[i].replace(".", "").replace("-", "").isdigit()
                                                   for r in cells[1:] if r[i])]
    return ["  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in cells]


def rule_rows(pairs: Sequence[tuple[dict[str, Any], str]],
              rules: dict[str, dict[str, Any]]) -> list[str]:
    """The per-rule table: findings, verdicts and precision."""
    head = ("rule", "name", "default", "findings", *VERDICTS, "precision")
    rows = []
    for code, c in sorted(tally(pairs, "code").items()):
        info = rules.get(code, {"name": "?", "default": False})
        rows.append((code, info["name"], "on" if info["default"] else "off", c["findings"],
                     *(c[v] for v in VERDICTS), fmt_p(precision(c))))
    tot = Counter(v for _, v in pairs)
    all_counts = {"findings": len(pairs), **{v: tot[v] for v in VERDICTS}}
    rows.append(("total", "", "", len(pairs), *(tot[v] for v in VERDICTS), fmt_p(precision(all_counts))))
    return table(head, rows)


def format_summary(cmp: Comparison, sources: Sequence[dict[str, Any]],
                   rules: dict[str, dict[str, Any]], *, columns: Sequence[str],
                   list_findings: bool = True, runtime: float | None = None,
                   provenance: str = "") -> str:
    """NEW/re-opened/GONE lists, the per-rule table and the per-source table.

    ``sources``: one dict per linted source with ``name``, ``files``, ``seconds`` and
    the ``columns`` printed before them (its pin, say)."""
    s = cmp.schema
    pairs = cmp.verdict_of()
    out: list[str] = []
    if list_findings:
        for rec in cmp.new:
            out.append(f"NEW  {rec[s.source]} {rec['path']}:{rec['line']}: {rec['code']} {rec['message']}")
        for rec, e in cmp.reopened:
            out.append(f"REOPENED {rec[s.source]} {rec['path']}:{rec['line']}: {rec['code']} "
                       f"[was {e['verdict']} at {e.get(s.pin, '?')}] {rec['text']}")
        for e in cmp.gone:
            out.append(f"GONE {e[s.source]} {e['path']}:{e.get('line', '?')}: {e['code']} "
                       f"[{e['verdict']}] {e['text']}")
        if out:
            out.append("")
    if provenance:
        out += [provenance, ""]
    out.extend(rule_rows(pairs, rules))
    out.append("")
    head = (s.source, *columns, "files", "seconds", "findings", *VERDICTS, "precision")
    per_src = tally(pairs, s.source)
    rows = []
    zero = dict.fromkeys(("findings", *VERDICTS), 0)
    for p in sources:
        c = per_src.get(p["name"], zero)
        name = p["name"] + (" (not linted)" if p.get("error") else "")
        rows.append((name, *(p.get(k, "") for k in columns), p["files"], f"{p['seconds']:.1f}",
                     c["findings"], *(c[v] for v in VERDICTS), fmt_p(precision(c))))
    tot = Counter(v for _, v in pairs)
    all_counts = {"findings": len(pairs), **{v: tot[v] for v in VERDICTS}}
    rows.append(("total", *("" for _ in columns), sum(p["files"] for p in sources),
                 f"{sum(p['seconds'] for p in sources):.1f}", len(pairs),
                 *(tot[v] for v in VERDICTS), fmt_p(precision(all_counts))))
    out.extend(table(head, rows))
    out.append("")
    out.append(f"{len(cmp.new)} new, {len(cmp.reopened)} re-opened, {len(cmp.gone)} gone"
               + (f"; linted in {runtime:.1f}s" if runtime is not None else ""))
    return "\n".join(out) + "\n"


def summary_json(cmp: Comparison, sources: Sequence[dict[str, Any]],
                 rules: dict[str, dict[str, Any]], failures: list[str],
                 runtime: float | None, *, sources_key: str) -> dict[str, Any]:
    pairs = cmp.verdict_of()
    per_rule = {code: {**c, "precision": precision(c), "default": rules.get(code, {}).get("default")}
                for code, c in sorted(tally(pairs, "code").items())}
    per_src = tally(pairs, cmp.schema.source)
    return {
        "rules": per_rule,
        sources_key: [{**p, **per_src.get(p["name"], {"findings": 0})} for p in sources],
        "new": cmp.new,
        "reopened": [{**cur, "was": e["verdict"]} for cur, e in cmp.reopened],
        "gone": cmp.gone,
        "check_failures": failures,
        "runtime_s": runtime,
        "trainlint": trainlint_provenance(),
    }


# --------------------------------------------------------------------------- front ends


def add_ledger_args(parser: argparse.ArgumentParser) -> None:
    """The options every corpus front end shares."""
    parser.add_argument("--select", help="passed to `trainlint check --select` (default: the default rules)")
    parser.add_argument("--update", action="store_true",
                        help="write NEW findings to the ledger as unreviewed (keeps GONE ones)")
    parser.add_argument("--prune", action="store_true", help="with --update: drop GONE entries")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a default rule is below 0.9 precision, a finding is "
                             "unreviewed (NEW or re-opened), or a true finding is gone")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="counts only: do not list NEW, re-opened and GONE findings")
    parser.add_argument("--jobs", type=int, help="passed to `trainlint check --jobs`")


@dataclass
class Run:
    """One corpus run: the findings produced now, and what the summary says of each source."""

    schema: Schema
    records: list[dict[str, Any]]
    #: per source: name, the pin and other ``columns``, files, seconds
    info: list[dict[str, Any]]
    #: source -> its tree, for re-linting with an opt-in option and for --migrate
    roots: dict[str, Path]
    runtime: float


def finish(run: Run, args: argparse.Namespace, *, ledger_path: Path, columns: Sequence[str],
           sources_key: str) -> int:
    """Compare a run with its ledger, print, update and gate: what every front end does last."""
    s = run.schema
    rules = rule_table()
    codes = selected_codes(rules, args.select) | {r["code"] for r in run.records}
    pins = {p["name"]: str(p[s.pin]) for p in run.info if not p.get("error")}
    ledger = read_ledger(ledger_path, s)

    def relint(source: str, paths: Sequence[str], code: str, option: str, value: Any) -> list[dict[str, Any]]:
        return relint_with_option(s, source, pins[source], run.roots[source], paths, code, option, value)

    if getattr(args, "migrate", False):
        # Only the new fields are filled in: no finding is added, no verdict touched.
        ledger = migrate(ledger, s, run.roots, run.records, _opt_in_findings(ledger, s, rules, relint))
        write_ledger(ledger, ledger_path, s)
    cmp = compare(s, run.records, ledger, pins=pins, codes=codes)

    failures = gate_failures(cmp, rules, relint)
    failures += [f"{p['name']}: not linted: {p['error']}" for p in run.info if p.get("error")]
    if args.json:
        print(json.dumps(summary_json(cmp, run.info, rules, failures, run.runtime,
                                      sources_key=sources_key), indent=2))
    else:
        print(format_summary(cmp, run.info, rules, columns=columns, list_findings=not args.quiet,
                             runtime=run.runtime, provenance=trainlint_provenance()), end="")
    if args.update:
        write_ledger(updated_ledger(cmp, prune=args.prune), ledger_path, s)
        if not args.json:
            print(f"ledger updated: {len(cmp.new)} added, {len(cmp.reopened)} re-opened"
                  + (f", {len(cmp.gone)} pruned" if args.prune else ""))
    if args.check:
        for msg in failures:
            print(f"check failed: {msg}", file=sys.stderr)
        return 1 if failures else 0
    return 0


def _opt_in_findings(ledger: Sequence[dict[str, Any]], schema: Schema, rules: dict[str, dict[str, Any]],
                     relint: Callable[..., list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What the options named by the ledger's old ``opt_in`` entries report (for --migrate)."""
    groups: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    for e in ledger:
        if "template" in e or not e.get("opt_in"):
            continue
        spec = e["opt_in"] if re.match(r"\s*TL\d{3}(\.|\s*$)", e["opt_in"]) else f"{e['code']}.{e['opt_in']}"
        parsed = parse_opt_in(spec, e["code"], rules)
        if not isinstance(parsed, str):
            groups[(e[schema.source], e["code"], parsed[0], json.dumps(parsed[1]))].add(e["path"])
    out: list[dict[str, Any]] = []
    for (source, code, option, value), paths in sorted(groups.items()):
        out += relint(source, sorted(paths), code, option, json.loads(value))
    return out


# --------------------------------------------------------------------------- across corpora


LEDGERS = ((ECOSYSTEM, HERE / "ecosystem" / "ledger.jsonl"), (RESEARCH, HERE / "research" / "ledger.jsonl"))


def cross_report(ledgers: Sequence[tuple[Schema, Path]] = LEDGERS) -> str:
    """Per rule, across the corpora's ledgers as reviewed (no linting): findings,
    verdicts, precision; one table per corpus, then both together. Entries the last
    ``--update`` found GONE are not counted."""
    rules = rule_table()
    out: list[str] = []
    everything: list[tuple[dict[str, Any], str]] = []
    for schema, path in ledgers:
        entries = read_ledger(path, schema)
        pairs = [(e, e["verdict"]) for e in entries if not e.get("gone")]
        everything += pairs
        out += [f"{path.parent.name}: {len(pairs)} findings as of the last --update "
                f"({len(entries) - len(pairs)} gone entries not counted)", *rule_rows(pairs, rules), ""]
    out += ["both corpora", *rule_rows(everything, rules)]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="What the corpus checks share.")
    parser.add_argument("--report", action="store_true",
                        help="per rule, across the ecosystem and research ledgers")
    args = parser.parse_args(argv)
    if not args.report:
        parser.print_help()
        return 2
    print(cross_report(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
