"""Where files are linted: one Linter per process, the collector paused for each file,
the process pool, and phase 1 of a run (each file after the files it imports). The run
itself (the cache, the project index, which files a second pass needs) is
:mod:`trainlint.runner`'s."""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainlint._collector import collector_paused
from trainlint._record import Record
from trainlint.analysis.project import ProjectIndex, import_order, own_view
from trainlint.config import RuleSelection, Settings, per_file_ignored
from trainlint.engine import SYNTAX_ERROR, FileResult, Linter
from trainlint.findings import InternalError


def display_path(path: Path) -> str:
    """Relative to the working directory when under it, else as given."""
    try:
        return path.absolute().relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


def read_file(path: Path) -> bytes | str:
    """The file's bytes, or what kept it from being read, in words a user can act on (a
    link that points nowhere is not a file that "does not exist")."""
    import errno

    try:
        return path.read_bytes()
    except IsADirectoryError:
        return "is a directory"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop"
        if exc.errno == errno.ENOENT and path.is_symlink():
            try:
                target = os.readlink(path)
            except OSError:
                return "dangling symbolic link"
            return f"dangling symbolic link (to {target}, which does not exist)"
        if exc.errno in (errno.EACCES, errno.EPERM):
            return "permission denied"
        return exc.strerror or type(exc).__name__


class FixMode(Record, frozen=True):
    """What to do with fixes: ``write`` them (``--fix``) or show a ``diff`` (``--diff``)."""

    __slots__ = ("write", "diff", "unsafe")

    def __init__(self, write: bool = False, diff: bool = False, unsafe: bool = False) -> None:
        self.write = write
        self.diff = diff
        self.unsafe = unsafe

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
                linter._meta_finding(
                    SYNTAX_ERROR, shown, 1, 1, f"cannot read file (not a syntax error): {data}"
                )
            )
        return result
    if path.suffix == ".ipynb":
        from trainlint.notebook import fix_notebook, lint_notebook

        if fix is not None and fix.active:
            return fix_notebook(linter, data, shown, ignored, path, fix)
        return lint_notebook(linter, data, shown, ignored)
    result = linter.lint_bytes(data, shown, ignored=ignored, view=view, module=module, keep=keep)
    if fix is not None and fix.active and fixable(result, fix):
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
        with collector_paused():
            return _lint_one(linter, settings, path, fix, view, module, keep)
    finally:
        _files_since_fuller += 1
        if _files_since_fuller >= _FULLER_EVERY:
            _files_since_fuller = 0
            gc.collect(1)
        else:
            gc.collect(0)


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

    from trainlint.rules import real_rule

    # The catalog's stand-ins import a rule's module when it first runs: import the
    # selected rules here, once, so that forked workers start with them (a run of many
    # files runs most of them) instead of each worker of each pool importing its own.
    for rule in selection.rules:
        real_rule(rule)
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


def lint_all(
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


def phase_one(
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
        return lint_all(items, selection, settings, timings, fix, jobs, tops)
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


def fixable(result: FileResult, fix: FixMode | None) -> bool:
    return (
        fix is not None
        and result.parsed
        and any(
            f.fix is not None and (f.fix.applicability == "safe" or fix.unsafe)
            for f in result.findings
        )
    )
