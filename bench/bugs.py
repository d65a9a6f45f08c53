"""Bug corpus check: does trainlint report confirmed training bugs, and stay silent on their fixes?

    python bench/bugs.py --mirror DIR           # lint, score, print recall and silence
    python bench/bugs.py --ids a,b              # only these instances
    python bench/bugs.py --validate             # check the instance files; lints nothing
    python bench/bugs.py --check                # exit 1 below the targets (see below)
    python bench/bugs.py --json                 # machine-readable results on stdout

Each confirmed bug is one file, ``bench/bugs/instances/<id>.toml`` (the format is in
``bench/bugs/README.md``): the repository, the buggy and the fixed commit, the labelled
lines at each, the family and the rule(s) that should report it. Repositories are read
from a mirror of bare git directories exactly as ``bench/research.py`` reads them
(``--mirror``, default ``$TRAINLINT_MIRROR``, else a clone from GitHub), and each
commit's tree is extracted once into ``bench/.corpus-cache/``.

Each commit is linted once, whole (what ``trainlint check .`` sees, plus the labelled
file wherever it lives), with the default selection plus ``--extend-select`` of the
rules of every instance at that commit, so an instance whose rule is off by default is
still scored; the output marks those instances ``opt-in``.

Scoring. *Caught*: at the buggy commit, a finding of one of the instance's rules in
its ``path`` within one of its ``lines`` ranges. *Silent on the fix*: at the fixed
commit, no finding of those rules in ``fixed_path`` within ``fixed_lines``. Recall is
printed overall, per family and per rule (an instance counts under each of its rules,
caught there when that rule reports it), with the fixed-commit silence rate and every
miss with what trainlint said near the labelled lines.

``--check`` exits 1 unless recall >= 0.8 overall and >= 0.6 in every family with at
least 5 instances, at least 0.9 of the fixes are silent, and every instance was linted.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
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
import research  # noqa: E402

INSTANCES_DIR = HERE / "bugs" / "instances"
CACHE_DIR = research.CACHE_DIR
FAMILIES = ("gradients", "schedules", "memory", "throughput", "concurrency", "numerics", "state")
EVIDENCE_KINDS = ("issue", "pr", "commit")
FIELDS = {"id": str, "repo": str, "family": str, "rules": list, "evidence": str,
          "evidence_kind": str, "buggy": str, "fixed": str, "path": str, "lines": list,
          "fixed_path": str, "fixed_lines": list, "summary": str}
RECALL_TARGET = 0.8
FAMILY_RECALL_TARGET = 0.6
FAMILY_MIN_INSTANCES = 5
SILENCE_TARGET = 0.9
#: How far around the labelled lines a miss lists what trainlint did say.
NEAR = 10
_SHA = re.compile(r"[0-9a-f]{40}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_EVIDENCE = {"issue": re.compile(rf"{_REPO.pattern}#\d+"), "pr": re.compile(rf"{_REPO.pattern}#\d+"),
             "commit": re.compile(rf"{_REPO.pattern}@[0-9a-f]{{7,40}}")}


@dataclass(frozen=True)
class Instance:
    id: str
    repo: str
    family: str
    rules: tuple[str, ...]
    evidence: str
    evidence_kind: str
    buggy: str
    fixed: str
    path: str
    lines: tuple[tuple[int, int], ...]
    fixed_path: str
    fixed_lines: tuple[tuple[int, int], ...]
    summary: str


def _ranges(value: Any) -> tuple[tuple[int, int], ...] | None:
    if not isinstance(value, list) or not value:
        return None
    out = []
    for r in value:
        if (not isinstance(r, list) or len(r) != 2 or not all(type(x) is int for x in r)
                or not 1 <= r[0] <= r[1]):
            return None
        out.append((r[0], r[1]))
    return tuple(out)


def field_problems(data: dict[str, Any], stem: str, known_rules: Iterable[str]) -> list[str]:
    """What is wrong with an instance file's fields (empty: nothing)."""
    problems = []
    for key, kind in FIELDS.items():
        if key not in data:
            problems.append(f"missing `{key}`")
        elif not isinstance(data[key], kind):
            problems.append(f"`{key}` must be a {kind.__name__}")
    problems += [f"unknown field `{k}`" for k in sorted(set(data) - set(FIELDS))]
    if problems:
        return problems
    if data["id"] != stem:
        problems.append(f"`id` is {data['id']!r}, the file is {stem}.toml")
    if not _REPO.fullmatch(data["repo"]):
        problems.append("`repo` must be owner/name")
    if data["family"] not in FAMILIES:
        problems.append(f"`family` must be one of {', '.join(FAMILIES)}")
    known = set(known_rules)
    if not data["rules"] or any(r not in known for r in data["rules"]):
        problems.append(f"`rules` must name trainlint rules: {data['rules']}")
    if data["evidence_kind"] not in EVIDENCE_KINDS:
        problems.append(f"`evidence_kind` must be one of {', '.join(EVIDENCE_KINDS)}")
    elif not _EVIDENCE[data["evidence_kind"]].fullmatch(data["evidence"]):
        form = "owner/name@sha" if data["evidence_kind"] == "commit" else "owner/name#number"
        problems.append(f"`evidence` must be {form} for evidence_kind {data['evidence_kind']!r}")
    for key in ("buggy", "fixed"):
        if not _SHA.fullmatch(data[key]):
            problems.append(f"`{key}` must be a 40-hex commit")
    if data["buggy"] == data["fixed"]:
        problems.append("`buggy` and `fixed` are the same commit")
    for key in ("lines", "fixed_lines"):
        if _ranges(data[key]) is None:
            problems.append(f"`{key}` must be a list of [first, last] line ranges (1-based, first <= last)")
    if not data["summary"].strip():
        problems.append("`summary` is empty")
    return problems


def load_instances(directory: Path, known_rules: Iterable[str],
                   ids: Sequence[str] | None = None) -> tuple[list[Instance], dict[str, list[str]]]:
    """The instances whose files are well formed, and the problems of the others."""
    known = list(known_rules)
    out: list[Instance] = []
    problems: dict[str, list[str]] = {}
    for path in sorted(directory.glob("*.toml")):
        if ids is not None and path.stem not in ids:
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            problems[path.stem] = [f"not readable TOML: {exc}"]
            continue
        found = field_problems(data, path.stem, known)
        if found:
            problems[path.stem] = found
            continue
        out.append(Instance(
            id=data["id"], repo=data["repo"], family=data["family"], rules=tuple(data["rules"]),
            evidence=data["evidence"], evidence_kind=data["evidence_kind"], buggy=data["buggy"],
            fixed=data["fixed"], path=data["path"], lines=_ranges(data["lines"]) or (),
            fixed_path=data["fixed_path"], fixed_lines=_ranges(data["fixed_lines"]) or (),
            summary=data["summary"]))
    return out, problems


# --------------------------------------------------------------------------- validate


def source_problems(inst: Instance, sources: corpus.GitSources) -> list[str]:
    """What the mirror says is wrong: commits absent, files absent, labels off the file."""
    problems = []
    for key, commit in (("buggy", inst.buggy), ("fixed", inst.fixed)):
        try:
            present = sources.has_commit(inst.repo, commit)
        except RuntimeError as exc:
            return [f"{inst.repo} cannot be read: {exc}"]
        if not present:
            problems.append(f"`{key}` {commit[:12]} is not in {sources.git_dir(inst.repo)}")
    if problems:
        return problems
    text = sources.show(inst.repo, inst.buggy, inst.path)
    if text is None:
        problems.append(f"`path` {inst.path} is not in the buggy commit")
    else:
        lines = text.splitlines()
        for first, last in inst.lines:
            if last > len(lines):
                problems.append(f"`lines` [{first}, {last}] beyond {inst.path}'s {len(lines)} lines")
            elif not lines[first - 1].strip() or not lines[last - 1].strip():
                problems.append(f"`lines` [{first}, {last}] starts or ends on a blank line")
    fixed_text = sources.show(inst.repo, inst.fixed, inst.fixed_path)
    if fixed_text is None:
        problems.append(f"`fixed_path` {inst.fixed_path} is not in the fixed commit")
    else:
        n = len(fixed_text.splitlines())
        problems += [f"`fixed_lines` [{a}, {b}] beyond {inst.fixed_path}'s {n} lines"
                     for a, b in inst.fixed_lines if b > n]
    return problems


# --------------------------------------------------------------------------- lint and score


@dataclass
class Score:
    id: str
    family: str
    rules: tuple[str, ...]
    #: rules that reported within the labelled lines at the buggy commit
    caught_by: list[str] = field(default_factory=list)
    #: findings of the instance's rules within fixed_lines at the fixed commit
    on_fix: list[str] = field(default_factory=list)
    #: the instance's rules that are off by default (scored through --extend-select)
    opt_in: list[str] = field(default_factory=list)
    #: what trainlint said near the labelled lines, for a miss
    near: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def caught(self) -> bool:
        return bool(self.caught_by)

    @property
    def silent_on_fix(self) -> bool:
        return not self.on_fix

    @property
    def needs_opt_in(self) -> bool:
        """Caught only by a rule that is off by default (or not caught, and all its rules are)."""
        rules = self.caught_by or list(self.rules)
        return all(r in self.opt_in for r in rules)


def lint_commits(instances: Sequence[Instance], sources: corpus.GitSources, *, jobs: int | None = None,
                 progress: bool = True) -> dict[tuple[str, str], list[dict[str, Any]] | str]:
    """(repo, commit) -> its findings (path relative to the tree), or why it could not be
    linted. Each commit once, however many instances share it."""
    wanted: dict[tuple[str, str], tuple[set[str], set[str]]] = defaultdict(lambda: (set(), set()))
    for inst in instances:
        for commit, path in ((inst.buggy, inst.path), (inst.fixed, inst.fixed_path)):
            rules, paths = wanted[(inst.repo, commit)]
            rules.update(inst.rules)
            paths.add(path)
    out: dict[tuple[str, str], list[dict[str, Any]] | str] = {}
    for (repo, commit), (rules, paths) in sorted(wanted.items()):
        start = time.perf_counter()
        try:
            root = sources.tree(repo, commit)
        except (RuntimeError, OSError) as exc:
            out[(repo, commit)] = str(exc)
            continue
        files = sorted(set(corpus.python_files(root)) | {p for p in paths if (root / p).is_file()})
        raw = corpus.lint_tree(root, files, extend_select=",".join(sorted(rules)), jobs=jobs)
        out[(repo, commit)] = corpus.to_records(corpus.RESEARCH, repo, commit, root, raw)
        if progress:
            print(f"  {repo}@{commit[:12]:<12} {len(files):>4} files {len(raw):>4} findings "
                  f"{time.perf_counter() - start:5.1f}s", file=sys.stderr)
    return out


def _within(line: int, ranges: Iterable[tuple[int, int]], slack: int = 0) -> bool:
    return any(a - slack <= line <= b + slack for a, b in ranges)


def score(inst: Instance, linted: dict[tuple[str, str], list[dict[str, Any]] | str],
          default_rules: set[str]) -> Score:
    s = Score(inst.id, inst.family, inst.rules, opt_in=[r for r in inst.rules if r not in default_rules])
    buggy, fixed = linted.get((inst.repo, inst.buggy), "not linted"), linted.get((inst.repo, inst.fixed), "not linted")
    if isinstance(buggy, str) or isinstance(fixed, str):
        s.error = buggy if isinstance(buggy, str) else str(fixed)
        return s
    in_file = [f for f in buggy if f["path"] == inst.path]
    s.caught_by = sorted({f["code"] for f in in_file
                          if f["code"] in inst.rules and _within(f["line"], inst.lines)})
    s.on_fix = [f"{f['path']}:{f['line']} {f['code']}" for f in fixed
                if f["path"] == inst.fixed_path and f["code"] in inst.rules
                and _within(f["line"], inst.fixed_lines)]
    if not s.caught:
        s.near = [f"{f['line']}: {f['code']} {f['message']}" for f in in_file
                  if _within(f["line"], inst.lines, NEAR)]
    return s


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def results(scores: Sequence[Score]) -> dict[str, Any]:
    """Recall overall, per family and per rule; the silence rate; the misses."""
    linted = [s for s in scores if not s.error]
    fam: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rule: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in linted:
        fam[s.family][0] += s.caught
        fam[s.family][1] += 1
        for r in s.rules:
            rule[r][0] += r in s.caught_by
            rule[r][1] += 1
    caught = sum(s.caught for s in linted)
    return {
        "instances": len(scores),
        "linted": len(linted),
        "caught": caught,
        "recall": _rate(caught, len(linted)),
        "recall_default_only": _rate(sum(s.caught and not s.needs_opt_in for s in linted), len(linted)),
        "silent_on_fix": sum(s.silent_on_fix for s in linted),
        "silence": _rate(sum(s.silent_on_fix for s in linted), len(linted)),
        "families": {f: {"caught": c, "instances": n, "recall": _rate(c, n)} for f, (c, n) in sorted(fam.items())},
        "rules": {r: {"caught": c, "instances": n, "recall": _rate(c, n)} for r, (c, n) in sorted(rule.items())},
        "opt_in": sorted(s.id for s in linted if s.needs_opt_in),
        "scores": [{**asdict(s), "caught": s.caught, "silent_on_fix": s.silent_on_fix} for s in scores],
    }


def check_failures(res: dict[str, Any]) -> list[str]:
    failures = []
    if res["recall"] is None or res["recall"] < RECALL_TARGET:
        failures.append(f"recall {corpus.fmt_p(res['recall'])} < {RECALL_TARGET}")
    for fam, row in res["families"].items():
        if row["instances"] >= FAMILY_MIN_INSTANCES and row["recall"] < FAMILY_RECALL_TARGET:
            failures.append(f"{fam}: recall {row['recall']:.2f} < {FAMILY_RECALL_TARGET}")
    if res["silence"] is None or res["silence"] < SILENCE_TARGET:
        failures.append(f"fixed-commit silence {corpus.fmt_p(res['silence'])} < {SILENCE_TARGET}")
    errors = [s for s in res["scores"] if s["error"]]
    if errors:
        failures.append(f"{len(errors)} instance(s) not linted")
    return failures


def format_results(res: dict[str, Any], instances: dict[str, Instance]) -> str:
    out = []
    for s in res["scores"]:
        inst = instances[s["id"]]
        if s["error"]:
            out.append(f"ERROR  {s['id']}: {s['error']}")
            continue
        where = f"{inst.path}:{','.join(f'{a}-{b}' for a, b in inst.lines)}"
        tag = "  (opt-in)" if s["id"] in res["opt_in"] else ""
        if not s["caught"]:
            out.append(f"MISS   {s['id']} [{'/'.join(inst.rules)}] {where}{tag}")
            out += [f"         near {n}" for n in s["near"]] or ["         nothing reported near"]
        if s["on_fix"]:
            out.append(f"NOISY  {s['id']}: at the fix {', '.join(s['on_fix'])}")
    if out:
        out.append("")
    fmt = corpus.fmt_p
    out += corpus.table(("family", "instances", "caught", "recall"),
                        [(f, r["instances"], r["caught"], fmt(r["recall"])) for f, r in res["families"].items()])
    out.append("")
    out += corpus.table(("rule", "instances", "caught", "recall"),
                        [(r, v["instances"], v["caught"], fmt(v["recall"])) for r, v in res["rules"].items()])
    out.append("")
    out.append(f"{res['caught']}/{res['linted']} caught: recall {fmt(res['recall'])} "
               f"({fmt(res['recall_default_only'])} with the default selection alone); "
               f"{res['silent_on_fix']}/{res['linted']} fixes silent: {fmt(res['silence'])}; "
               f"{res['instances'] - res['linted']} not linted")
    if res["opt_in"]:
        out.append(f"relying on an opt-in rule: {', '.join(res['opt_in'])}")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score trainlint on confirmed training bugs.")
    parser.add_argument("--ids", help="comma-separated instance ids (default: all)")
    parser.add_argument("--validate", action="store_true",
                        help="check the instance files against the mirror; lint nothing")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 unless recall >= {RECALL_TARGET} (>= {FAMILY_RECALL_TARGET} per family "
                             f"of {FAMILY_MIN_INSTANCES}+) and >= {SILENCE_TARGET} of the fixes are silent")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--jobs", type=int, help="passed to `trainlint check --jobs`")
    parser.add_argument("--mirror", type=Path, default=research.default_mirror(),
                        help="folder of owner+name/repo bare git directories "
                             "(default: $TRAINLINT_MIRROR; without one, clone from GitHub)")
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--instances-dir", type=Path, default=INSTANCES_DIR)
    args = parser.parse_args(argv)

    rules = corpus.rule_table()
    ids = [i.strip() for i in args.ids.split(",") if i.strip()] if args.ids else None
    instances, problems = load_instances(args.instances_dir, rules, ids)
    if ids is not None:
        unknown = sorted(set(ids) - {i.id for i in instances} - set(problems))
        if unknown:
            parser.error(f"no such instance: {', '.join(unknown)}")
    sources = corpus.GitSources(args.cache_dir, args.mirror)
    if args.validate:
        for inst in instances:
            found = source_problems(inst, sources)
            if found:
                problems[inst.id] = found
        total = len(instances) + len([p for p in problems if p not in {i.id for i in instances}])
        if args.json:
            print(json.dumps({"instances": total, "problems": problems}, indent=2))
        else:
            for stem, found in sorted(problems.items()):
                print("\n".join(f"{stem}: {p}" for p in found))
            print(f"{total} instance(s), {total - len(problems)} valid, {len(problems)} with problems")
        return 1 if problems else 0
    for stem, found in sorted(problems.items()):
        print(f"{stem}: skipped: {'; '.join(found)}", file=sys.stderr)
    linted = lint_commits(instances, sources, jobs=args.jobs, progress=not args.json)
    default_rules = {c for c, r in rules.items() if r["default"]}
    res = results([score(i, linted, default_rules) for i in instances])
    failures = check_failures(res) + [f"{len(problems)} instance file(s) malformed"] * bool(problems)
    if args.json:
        print(json.dumps({**res, "check_failures": failures, "trainlint": corpus.trainlint_provenance()},
                         indent=2))
    else:
        print(corpus.trainlint_provenance() + "\n")
        print(format_results(res, {i.id: i for i in instances}), end="")
    if args.check:
        for msg in failures:
            print(f"check failed: {msg}", file=sys.stderr)
        return 1 if failures else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
