"""Many files: read, lint (in a process pool when asked), order results, count exit status."""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlint._collector import collector_paused
from trainlint._record import Record
from trainlint.analysis.project import ProjectIndex, digest, import_graph, module_of
from trainlint.config import RuleSelection, Settings, TorchPins, per_file_ignored
from trainlint.engine import FileResult
from trainlint.findings import Finding, InternalError
from trainlint.workers import (  # (display_path, read_file, FixMode, lint_file: public here)
    FixMode,
    display_path,
    fixable,
    lint_all,
    lint_file,
    phase_one,
    read_file,
)

if TYPE_CHECKING:
    from trainlint.cache import Cache

__all__ = ["FixMode", "RunResult", "display_path", "lint_file", "read_file", "run"]


class RunResult(Record):
    """What a run gave: every file's findings and errors, and the totals."""

    __slots__ = ("findings", "errors", "files", "timings", "fixed", "diffs", "fixed_files")

    def __init__(
        self,
        findings: list[Finding] | None = None,
        errors: list[InternalError] | None = None,
        files: int = 0,
        timings: dict[str, float] | None = None,
        fixed: int = 0,
        diffs: list[str] | None = None,
        fixed_files: list[tuple[str, int]] | None = None,
    ) -> None:
        self.findings = [] if findings is None else findings
        self.errors = [] if errors is None else errors
        self.files = files
        self.timings = {} if timings is None else timings
        self.fixed = fixed
        self.diffs = [] if diffs is None else diffs
        #: (path, fixes applied) of each file a fix run changed, in run order
        self.fixed_files = [] if fixed_files is None else fixed_files

    @property
    def files_with_findings(self) -> int:
        return len({f.path for f in self.findings})

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.findings else 0


def run(
    paths: Sequence[Path],
    selection: RuleSelection,
    settings: Settings,
    *,
    jobs: int | None = None,
    timings: bool = False,
    fix: FixMode | None = None,
    cache: Cache | None = None,
) -> RunResult:
    """Lint ``paths``. Two phases share one parse per file: every file is linted and
    summarised (summaries are cached by content), with the part of its view its own
    summary gives; the project index built from the summaries gives each file its whole
    view; only files whose whole view differs from that part are linted again, with it.
    A file's cached findings are keyed on its bytes and its view."""
    # Once the index is built, the summaries and views live to the end of the run: frozen
    # (gc.freeze), the collector's full pass that follows does not walk them, which was
    # 2.6% of a cold run on torch's sources. Not where the caller froze objects itself:
    # the thaw at the end would thaw those too.
    freeze = gc.isenabled() and gc.get_freeze_count() == 0
    try:
        return _run(paths, selection, settings, jobs, timings, fix, cache, freeze)
    finally:
        if freeze:
            gc.unfreeze()


def _run(
    paths: Sequence[Path],
    selection: RuleSelection,
    settings: Settings,
    jobs: int | None,
    timings: bool,
    fix: FixMode | None,
    cache: Cache | None,
    freeze: bool,
) -> RunResult:
    jobs = jobs if jobs else (os.cpu_count() or 1)
    n = len(paths)
    checking = fix is None or not fix.active
    modules: list[tuple[str, str, bool] | None] = [
        module_of(p) if p.suffix == ".py" else None for p in paths
    ]
    # each root's top-level modules: a summary leaves out the calls into any other
    # (`gym.make(env)`: no file of the run can tell what such a callee does with `env`)
    tops: dict[str, frozenset[str]] = {}
    for mod in modules:
        if mod is not None:
            tops[mod[0]] = tops.get(mod[0], frozenset()) | {mod[1].split(".", 1)[0]}
    use_cache = cache is not None and checking
    hashes: dict[int, str] = {}
    summaries: dict[int, dict[str, Any]] = {}
    if use_cache:
        from trainlint.cache import content_hash

        assert cache is not None
        for i, p in enumerate(paths):
            data = read_file(p)
            if isinstance(data, str):
                continue
            hashes[i] = content_hash(data)
            mod = modules[i]
            if mod is not None:
                found = cache.get_summary(hashes[i], mod)
                if found is not None:
                    summaries[i] = found
    # A summary carries what only the files importing its file read (returns, kept
    # parameters, step effects: most of its cost) for the names other files of the run may
    # import from it, by the import lines of their bytes; all of it for a module imported
    # whole (`import m`, `from pkg import m`, `from m import *`) and for a package.
    graph = import_graph([(p, modules[i]) for i, p in enumerate(paths)], read_file)
    deps = [list(imports) for imports in graph]
    needed: dict[int, set[str] | None] = {}
    for k, imports in enumerate(graph):
        for d, names in imports.items():
            if d != k:
                had = needed.get(d, set())
                needed[d] = None if names is None or had is None else had | names
    keep = {
        i: frozenset(needed.get(i) or ())
        for i, mod in enumerate(modules)
        if mod is not None and not mod[2] and needed.get(i, ()) is not None
    }
    for i in [
        i
        for i, s in summaries.items()
        if ("lean" in s and not (i in keep and keep[i] <= set(s["lean"])))
        or not tops.get(s["root"], frozenset()).isdisjoint(s.get("outside", ()))
    ]:
        # cached when the other files imported less of it, or when the run had no module
        # that some of its calls went to
        del summaries[i]
    # phase 1: files not summarised yet (every file on a cold run), linted without a view;
    # a fix run fixes nothing yet: its fixes wait for the views (phase 2)
    fresh: dict[int, FileResult] = {}
    views: dict[int, dict[str, Any] | None] = {}
    first = [i for i in range(n) if i not in summaries]
    while True:
        done = phase_one(
            first,
            paths,
            modules,
            deps,
            keep,
            summaries,
            selection,
            settings,
            timings,
            fix if checking else None,
            jobs,
            tops,
        )
        for i, r in zip(first, done, strict=True):
            fresh[i] = r
            if r.summary is not None:
                summaries[i] = r.summary
                if use_cache and i in hashes and not r.errors:
                    cache.put_summary(hashes[i], modules[i], r.summary)  # type: ignore[union-attr,arg-type]
            r.summary = None  # the index has it; the result travels without it
        with collector_paused():  # the summaries are every file's: nothing here is garbage
            index = ProjectIndex(list(summaries.values())) if summaries else None
            if index is not None:
                for i in range(n):
                    mod = modules[i]
                    if mod is not None:
                        views[i] = index.view(mod[0], mod[1])
            if freeze:
                gc.freeze()
            # A view asked a lean summary for what it left out (an import the byte scan
            # missed, a file's own factory): those files are summarised in full, again.
            read = index.lean_read if index is not None else set()
            first = [
                i
                for i in sorted(keep)
                if (mod := modules[i]) is not None
                and (mod[0], mod[1]) in read
                and "lean" in summaries.get(i, {})
            ]
            for i in first:
                del keep[i]
            del index
        if not first:
            break
    del summaries
    results: dict[int, FileResult] = {}
    keys: dict[int, str] = {}
    second: list[int] = []
    pins = TorchPins() if use_cache else None
    for i, p in enumerate(paths):
        view = views.get(i)
        view_digest = digest(view)
        if use_cache and i in hashes:
            assert cache is not None and pins is not None
            # A file's findings also depend on its project's torch pin (TL702): editing the
            # pin in pyproject.toml must re-lint files whose bytes did not change.
            key = cache.key_of_hash(
                hashes[i],
                p.suffix,
                sorted(per_file_ignored(settings, p)),
                extra=f"torch-pin={pins.for_file(str(p))};project={view_digest}",
            )
            hit = cache.get(key, display_path(p))
            if hit is not None:
                results[i] = hit
                continue
            keys[i] = key
        if (
            i in fresh
            and view_digest == fresh[i].view
            and (checking or (p.suffix != ".ipynb" and not fixable(fresh[i], fix)))
        ):
            results[i] = fresh[i]
        else:
            second.append(i)
    fresh.clear()
    if second:
        done = lint_all(
            [(paths[i], views.get(i), None, None) for i in second],
            selection,
            settings,
            timings,
            fix,
            jobs,
        )
        for i, r in zip(second, done, strict=True):
            results[i] = r
    if use_cache:
        assert cache is not None
        for i, key in keys.items():
            cache.put(key, results[i])
    ordered = [results[i] for i in range(n)]
    out = RunResult(files=n)
    for r in ordered:
        out.findings.extend(r.findings)
        out.errors.extend(r.errors)
        out.fixed += r.fixed
        if r.fixed and not r.diff:
            out.fixed_files.append((r.path, r.fixed))
        if r.diff:
            out.diffs.append(r.diff)
        for code, t in r.timings.items():
            out.timings[code] = out.timings.get(code, 0.0) + t
    out.findings.sort(key=Finding.sort_key)
    return out
