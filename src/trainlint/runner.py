"""Many files: read, lint (in a process pool when asked), order results, count exit status."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainlint.analysis.project import (
    ProjectIndex,
    digest,
    import_graph,
    import_order,
    module_of,
    own_view,
)
from trainlint.cache import Cache, content_hash
from trainlint.config import RuleSelection, Settings, TorchPins, per_file_ignored
from trainlint.engine import SYNTAX_ERROR, FileResult, Linter
from trainlint.findings import Finding, InternalError


@dataclass
class RunResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[InternalError] = field(default_factory=list)
    files: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    fixed: int = 0
    diffs: list[str] = field(default_factory=list)

    @property
    def files_with_findings(self) -> int:
        return len({f.path for f in self.findings})

    @property
    def exit_code(self) -> int:
        if self.errors:
            return 2
        return 1 if self.findings else 0


def display_path(path: Path) -> str:
    """Relative to the working directory when under it, else as given."""
    try:
        return path.absolute().relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


def read_file(path: Path) -> bytes | str:
    """The file's bytes, or an error message when it cannot be read."""
    try:
        return path.read_bytes()
    except IsADirectoryError:
        return "is a directory"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


@dataclass(frozen=True)
class FixMode:
    """What to do with fixes: ``write`` them (``--fix``) or show a ``diff`` (``--diff``)."""

    write: bool = False
    diff: bool = False
    unsafe: bool = False

    @property
    def active(self) -> bool:
        return self.write or self.diff


def lint_file(
    linter: Linter,
    settings: Settings,
    path: Path,
    fix: FixMode | None = None,
    view: dict[str, Any] | None = None,
    module: tuple[str, str, bool] | None = None,
    keep: frozenset[str] | None = None,
) -> FileResult:
    """Lint one file. ``view``: what the project index knows for it; ``module``: its
    (root, name, is package) when the run wants its project summary back; ``keep``: the
    names other files import from it, when known (``project.summarize``)."""
    shown = display_path(path)
    ignored = per_file_ignored(settings, path)
    data = read_file(path)
    if isinstance(data, str):
        result = FileResult(shown)
        if SYNTAX_ERROR in linter.enabled:
            result.findings.append(
                linter._meta_finding(SYNTAX_ERROR, shown, 1, 1, f"cannot read file: {data}")
            )
        return result
    if path.suffix == ".ipynb":
        from trainlint.notebook import fix_notebook, lint_notebook

        if fix is not None and fix.active:
            return fix_notebook(linter, data, shown, ignored, path, fix)
        return lint_notebook(linter, data, shown, ignored)
    result = linter.lint_bytes(data, shown, ignored=ignored, view=view, module=module, keep=keep)
    if fix is not None and fix.active and _fixable(result, fix):
        from trainlint.fix import fix_python

        result = fix_python(linter, data, shown, ignored, path, fix, view)
    return result


# Worker-process state: one Linter per process, built once by the pool initializer.
_WORKER: tuple[Linter, Settings, FixMode | None] | None = None


def _init_worker(
    selection: RuleSelection,
    settings: Settings,
    timings: bool,
    fix: FixMode | None = None,
    tops: dict[str, frozenset[str]] | None = None,
) -> None:
    global _WORKER
    linter = Linter(selection, timings=timings)
    linter.project_tops = tops
    _WORKER = (linter, settings, fix)


# Garbage collection while linting. A file's tree and model are alive until its rules
# have run, so the collector's passes over young objects find nothing to free: they
# only walk the tree again (a fifth of the run, measured). The engine frees each model
# by reference counting (FileModel.release), so the collector is paused for the length
# of one file and then clears that file's few leftover cycles in one young-generation
# pass; every _FULLER_EVERY files, a pass over the middle generation too.
_FULLER_EVERY = 16
_files_since_fuller = 0


#: One file's work: its path, its project view, its module when its summary is wanted, and
#: the names the other files import from it when known (None: the whole summary).
WorkItem = tuple[
    Path, "dict[str, Any] | None", "tuple[str, str, bool] | None", "frozenset[str] | None"
]


def _work(item: Path | WorkItem) -> FileResult:
    global _files_since_fuller
    assert _WORKER is not None
    linter, settings, fix = _WORKER
    path, view, module, keep = (item, None, None, None) if isinstance(item, Path) else item
    if not gc.isenabled():  # the caller manages collection; leave it alone
        return _lint_one(linter, settings, path, fix, view, module, keep)
    try:
        with _collector_paused():
            return _lint_one(linter, settings, path, fix, view, module, keep)
    finally:
        _files_since_fuller += 1
        if _files_since_fuller >= _FULLER_EVERY:
            _files_since_fuller = 0
            gc.collect(1)
        else:
            gc.collect(0)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """No collection for the length of the block, when the collector is on: while a
    file's model or the project index is built, its passes would find nothing to free."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _lint_one(
    linter: Linter,
    settings: Settings,
    path: Path,
    fix: FixMode | None,
    view: dict[str, Any] | None = None,
    module: tuple[str, str, bool] | None = None,
    keep: frozenset[str] | None = None,
) -> FileResult:
    try:
        return lint_file(linter, settings, path, fix, view, module, keep)
    except Exception as exc:  # never lose the rest of the run to one file
        return FileResult(
            display_path(path), errors=[InternalError(display_path(path), "engine", repr(exc))]
        )


def _run_pool(
    paths: Sequence[Path | WorkItem],
    selection: RuleSelection,
    settings: Settings,
    timings: bool,
    fix: FixMode | None,
    jobs: int,
    tops: dict[str, frozenset[str]] | None = None,
) -> list[FileResult]:
    """Lint in worker processes; a worker that dies is retried in-process, never dropped."""
    # imported here: a run that stays in this process (one file, --jobs 1) never pays
    # for multiprocessing's import
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    chunk = max(1, min(64, len(paths) // (jobs * 4)))
    try:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(paths)),
            initializer=_init_worker,
            initargs=(selection, settings, timings, fix, tops),
        ) as pool:
            return list(pool.map(_work, paths, chunksize=chunk))
    except BrokenProcessPool:
        # A worker was killed (OOM killer, a segfault in a C extension): redo the files
        # one at a time here, so a file that kills us again is reported, not lost.
        _init_worker(selection, settings, timings, fix, tops)
        return [_work(p) for p in paths]


def _lint_all(
    items: list[WorkItem],
    selection: RuleSelection,
    settings: Settings,
    timings: bool,
    fix: FixMode | None,
    jobs: int,
    tops: dict[str, frozenset[str]] | None = None,
) -> list[FileResult]:
    if jobs <= 1 or len(items) < 4:
        _init_worker(selection, settings, timings, fix, tops)
        return [_work(item) for item in items]
    return _run_pool(items, selection, settings, timings, fix, jobs, tops)


def _lint_imported_first(
    items: list[WorkItem],
    deps: list[list[int]],
    known: list[dict[str, Any]],
    selection: RuleSelection,
    settings: Settings,
    timings: bool,
    fix: FixMode | None,
    tops: dict[str, frozenset[str]] | None = None,
) -> list[FileResult]:
    """Phase 1 in this process: each file after the files it imports (``deps``, by
    position in ``items``; an import cycle cut where it closes), linted with the view the
    summaries so far give it (``known``: those the cache had). What another file learns
    from a file linted after it (a caller's arguments) is not known yet: such a file is
    linted again in phase 2."""
    _init_worker(selection, settings, timings, fix, tops)
    assert _WORKER is not None
    linter = _WORKER[0]
    index = ProjectIndex(known, growing=True)
    linter.speculate = index.speculate
    out: list[FileResult | None] = [None] * len(items)
    try:
        for k in import_order(deps):
            r = _work(items[k])
            if r.summary is not None:
                index.add(r.summary)
            out[k] = r
    finally:
        linter.speculate = own_view  # (the index goes with this phase)
    return out  # type: ignore[return-value]


def _phase_one(
    first: list[int],
    paths: Sequence[Path],
    modules: list[tuple[str, str, bool] | None],
    deps: list[list[int]],
    keep: dict[int, frozenset[str]],
    summaries: dict[int, dict[str, Any]],
    selection: RuleSelection,
    settings: Settings,
    timings: bool,
    fix: FixMode | None,
    jobs: int,
    tops: dict[str, frozenset[str]] | None = None,
) -> list[FileResult]:
    """Lint and summarise the files at positions ``first`` without a view (with ``keep``:
    the names other files import from them, where known; ``tops``: each root's top-level
    modules in the run): in this process each after the files it imports, else in the
    pool."""
    if not first:
        return []
    items: list[WorkItem] = [(paths[i], None, modules[i], keep.get(i)) for i in first]
    if jobs > 1 and len(items) >= 4:
        return _lint_all(items, selection, settings, timings, fix, jobs, tops)
    at = {i: k for k, i in enumerate(first)}
    known = [s for i, s in summaries.items() if i not in at]
    return _lint_imported_first(
        items,
        [[at[d] for d in deps[i] if d in at] for i in first],
        known,
        selection,
        settings,
        timings,
        fix,
        tops,
    )


def _fixable(result: FileResult, fix: FixMode | None) -> bool:
    return (
        fix is not None
        and result.parsed
        and any(
            f.fix is not None and (f.fix.applicability == "safe" or fix.unsafe)
            for f in result.findings
        )
    )


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
        done = _phase_one(
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
        with _collector_paused():  # the summaries are every file's: nothing here is garbage
            index = ProjectIndex(list(summaries.values())) if summaries else None
            if index is not None:
                for i in range(n):
                    mod = modules[i]
                    if mod is not None:
                        views[i] = index.view(mod[0], mod[1])
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
            and (checking or (p.suffix != ".ipynb" and not _fixable(fresh[i], fix)))
        ):
            results[i] = fresh[i]
        else:
            second.append(i)
    fresh.clear()
    if second:
        done = _lint_all(
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
        if r.diff:
            out.diffs.append(r.diff)
        for code, t in r.timings.items():
            out.timings[code] = out.timings.get(code, 0.0) + t
    out.findings.sort(key=Finding.sort_key)
    return out
