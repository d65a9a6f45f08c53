"""Lint one file: decode, parse once, pre-filter, build the shared model, run rules, suppress.

Every file is parsed with CPython's parser (cheap), so TL001 is exact: a file is a
syntax error precisely when ``ast.parse`` rejects it. The semantic model is built,
and rules run, only when the file contains a trigger word of some selected rule.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from trainlint.analysis.context import is_test_file
from trainlint.analysis.model import FileModel
from trainlint.analysis.project import (
    EFFECT_WORDS,
    SUMMARY_WORDS,
    apply_view,
    bare_summary,
    digest,
    own_view,
    view_words,
)
from trainlint.analysis.project import summarize as project_summary
from trainlint.analysis.project_views import with_data, without_facts
from trainlint.config import TARGET_TORCH, RuleSelection, TorchPins
from trainlint.findings import FileResult, Finding, Fix, InternalError, Related
from trainlint.noqa import (
    INVALID,
    OWN_PREFIX,
    file_noqa_codes,
    noqa_comments,
    noqa_on_lines,
    unused_codes_edit,
)
from trainlint.rules.base import Report, Rule
from trainlint.source import Source, SourceError, decode, parse
from trainlint.words import FileWords, WordTable

SYNTAX_ERROR = "TL001"
UNUSED_NOQA = "TL002"
ENGINE_RULES = (SYNTAX_ERROR, UNUSED_NOQA)
#: Files larger than this are reported and skipped rather than analysed.
MAX_FILE_BYTES = 10 * 1024 * 1024


def _without(rules: list[Rule], codes: list[str]) -> list[Rule]:
    """``rules`` less those a file-level ``# trainlint: noqa: CODES`` turns off."""
    return [r for r in rules if not any(r.code.startswith(c) for c in codes)]


class Linter:
    """Holds the instantiated rules of one run; lints files one at a time."""

    def __init__(self, selection: RuleSelection, *, timings: bool = False) -> None:
        self.selection = selection
        self.enabled = selection.codes
        self.rules: list[Rule] = [
            cls(selection.options.get(cls.code))
            for cls in selection.rules
            if cls.code not in ENGINE_RULES
        ]
        self.rule_classes = {cls.code: cls for cls in selection.rules}
        self.known = selection.known or _builtincodes_of() | self.enabled
        # The trigger words of the whole selection and the project summary's, numbered
        # once: each distinct word is searched for at most once per file, and only until
        # every rule is decided.
        self.words = WordTable(
            [[t.encode() for t in rule.triggers] for rule in self.rules]
            + [SUMMARY_WORDS, EFFECT_WORDS]
        )
        self._triggers = list(zip(self.rules, self.words.groups[:-2], strict=True))
        self._summary_words, self._effect_words = self.words.groups[-2:]
        self.collect_timings = timings
        self._torch_pins = TorchPins()
        #: A file's summary -> the part of its project view known before the whole
        #: project is summarised (the runner swaps in its growing index).
        self.speculate: Callable[[dict[str, Any]], dict[str, Any] | None] = own_view
        #: root -> the top-level modules a run has under that root, set by the runner: a
        #: summary leaves out the calls into any other (``project.summarize``'s ``within``)
        self.project_tops: dict[str, frozenset[str]] | None = None

    # -- public ---------------------------------------------------------------------------
    def lint_bytes(
        self,
        data: bytes,
        path: str,
        *,
        ignored: Iterable[str] = (),
        text: str | None = None,
        view: dict[str, Any] | None = None,
        module: tuple[str, str, bool] | None = None,
        keep: frozenset[str] | None = None,
    ) -> FileResult:
        """Lint one file's bytes. ``ignored``: selectors off for this file (per-file-ignores).

        ``text`` may carry an already-decoded module (notebooks); then ``data`` is only
        used for the trigger pre-filter. ``view``: what the project index knows for this
        file. ``module``: (root, name, is package) when the run wants the file's project
        summary back (``result.summary``), taken from the same parse; ``keep``: the names
        other files import from it, when known: what only they read is summarised for
        those alone (``project.summarize``).
        """
        result = FileResult(path)
        try:
            return self._lint_bytes(result, data, path, ignored, text, view, module, keep)
        finally:
            if module is not None and result.summary is None:
                result.summary = bare_summary(module)

    def _lint_bytes(
        self,
        result: FileResult,
        data: bytes,
        path: str,
        ignored: Iterable[str],
        text: str | None,
        view: dict[str, Any] | None,
        module: tuple[str, str, bool] | None,
        keep: frozenset[str] | None = None,
    ) -> FileResult:
        ignored = tuple(ignored)

        def on(code: str) -> bool:
            return self.is_on(code, ignored)

        if len(data) > MAX_FILE_BYTES:
            if on(SYNTAX_ERROR):
                result.findings.append(
                    self._meta_finding(
                        SYNTAX_ERROR,
                        path,
                        1,
                        1,
                        f"file too large to analyse ({len(data) // 1024 // 1024} MiB > "
                        f"{MAX_FILE_BYTES // 1024 // 1024} MiB); skipped",
                    )
                )
            return result
        found = FileWords(self.words, data)
        active = self._active_rules(data, view, path, ignored, found)
        check_noqa = on(UNUSED_NOQA) and b"noqa" in data.lower()
        encoding = ""
        if not active and not check_noqa and not on(SYNTAX_ERROR) and module is None:
            return result
        try:
            if text is None:
                text, encoding = decode(data)
            file_noqa = file_noqa_codes(text)
            if file_noqa is not None and not file_noqa and module is None:
                return result  # `# trainlint: noqa` skips the whole file
            tree = parse(text, path)
        except SourceError as exc:
            result.syntax_error = True
            if on(SYNTAX_ERROR):
                result.findings.append(
                    self._meta_finding(SYNTAX_ERROR, path, exc.line, exc.column, exc.message)
                )
            return result
        result.parsed = True
        skip_file = file_noqa is not None and not file_noqa  # summarised, never reported
        if skip_file:
            active, check_noqa = [], False
        elif file_noqa:
            active = _without(active, file_noqa)
        facts = module is not None and found.any(self._summary_words)
        summarize = facts or module is not None and found.any(self._effect_words)
        if not active and not check_noqa and not summarize:
            if module is not None:
                result.summary = project_summary(None, tree, module, keep=keep, text=text)
            return result
        source = Source(text)
        try:
            model = FileModel(tree, source, path)
            apply_view(model, view)
        except Exception as exc:  # pragma: no cover - a bug in the model, not in the input
            result.errors.append(InternalError(path, "analysis", _describe(exc)))
            return result
        raw: list[Finding] = []
        try:
            if module is not None:
                # First, from the model as the file alone gives it: the summary feeds the
                # other files' views and must not depend on this file's own view.
                try:
                    tops = self.project_tops
                    result.summary = project_summary(
                        model if summarize else None,
                        tree,
                        module,
                        facts,
                        keep,
                        tops.get(module[0], frozenset()) if tops is not None else None,
                        text=text,
                    )
                except Exception as exc:  # pragma: no cover - a bug in the summary
                    result.errors.append(InternalError(path, "project summary", _describe(exc)))
                own = (
                    self.speculate(result.summary)
                    if result.summary and not skip_file and without_facts(view)
                    else None
                )
                if own:
                    own = with_data(own, view)  # the project's data split, when told
                    # What is known of the file's view already: what its own call sites
                    # settle (a helper whose every call passes a model), and what the
                    # files it imports, linted before it, say. Lint with that: when the
                    # whole project's view says no more, the run keeps these findings and
                    # does not lint the file a second time.
                    model.forget_analyses()
                    apply_view(model, own)
                    result.view = digest(own)
                    active = self._active_rules(data, own, path, ignored, found)
                    if file_noqa:
                        active = _without(active, file_noqa)
            if any(TARGET_TORCH in rule.options for rule in active):
                model.torch_pin = self._torch_pins.for_file(path)
            for rule in active:
                start = time.perf_counter() if self.collect_timings else 0.0
                try:
                    reports = list(rule.check(model))
                except Exception as exc:
                    result.errors.append(
                        InternalError(path, f"{rule.code} {rule.name}", _describe(exc))
                    )
                    continue
                finally:
                    if self.collect_timings:
                        result.timings[rule.code] = time.perf_counter() - start
                for report in reports:
                    raw.append(self._finding(rule, report, source, path))
        finally:
            model.release()
            del model
        if skip_file:
            return result
        spelled = True  # (else _suppress looks for `noqa` in the lowered text)
        if encoding.startswith("utf-8"):  # its text spells `noqa` exactly where its bytes do
            spelled = check_noqa if on(UNUSED_NOQA) else b"noqa" in data.lower()
        kept = self._suppress(raw, source, on(UNUSED_NOQA), path) if spelled else raw
        result.findings.extend(kept)
        result.findings.sort(key=Finding.sort_key)
        return result

    def is_on(self, code: str, ignored: Iterable[str] = ()) -> bool:
        """Whether ``code`` is selected and not turned off by ``ignored`` (per-file-ignores)."""
        return code in self.enabled and not any(code.startswith(i) for i in ignored)

    # -- internals ------------------------------------------------------------------------
    def _active_rules(
        self,
        data: bytes,
        view: dict[str, Any] | None,
        path: str,
        ignored: tuple[str, ...],
        words: FileWords | None = None,
    ) -> list[Rule]:
        """The rules to run on ``data``: on for this file, and some trigger word present
        (the project view's facts stand in for words the file does not spell itself).
        ``words``: the file's word search, when the caller has one."""
        if words is None:
            words = FileWords(self.words, data)
        has: Callable[[int], bool] = words.has
        if view:
            has = words.followed_by(view_words(view))
        in_tests = is_test_file(path)
        active: list[Rule] = []
        # a word found already is answered without a call; one searched for and absent
        # too, unless a view's words follow the bytes (then `has` looks there as well)
        present = words.present
        again = bool(view)
        for rule, trig in self._triggers:
            if in_tests and not rule.test_files:
                continue
            if ignored and not self.is_on(rule.code, ignored):
                continue
            if rule.code not in self.enabled:
                continue
            if not trig:
                active.append(rule)
                continue
            for i in trig:
                found = present[i]
                if found or (found is None or again) and has(i):
                    active.append(rule)
                    break
        return active

    def _meta_finding(
        self, code: str, path: str, line: int, column: int, message: str, end: Any = None
    ) -> Finding:
        cls = self.rule_classes.get(code)
        name = cls.name if cls is not None else code
        end_line, end_col = end if end else (line, column)
        return Finding(code, name, path, line, column, end_line, end_col, message, "error")

    def _finding(self, rule: Rule, report: Report, source: Source, path: str) -> Finding:
        if report.span is not None:
            line, col, end_line, end_col = report.span
        else:
            assert report.node is not None
            line, col, end_line, end_col = source.span(report.node)
        related = tuple(
            Related(*source.span(node), what)
            for node, what in report.related
            if getattr(node, "lineno", None) is not None
        )
        return Finding(
            rule.code,
            rule.name,
            path,
            line,
            col,
            end_line,
            end_col,
            report.message,
            rule.severity,
            report.fix,
            related=related,
        )

    def _suppress(
        self, findings: list[Finding], source: Source, report_unused: bool, path: str
    ) -> list[Finding]:
        if "noqa" not in source.text.lower():
            return findings
        # Tokenizing is costly; only TL002 needs to know every real comment. For
        # suppression, the lines that carry findings are enough.
        if report_unused or noqa_on_lines(
            source, {ln for f in findings for ln in (f.line, f.end_line)}
        ):
            directives = noqa_comments(source)  # confirm they are real comments
        else:
            directives = {}
        used: dict[int, set[str]] = defaultdict(set)
        kept: list[Finding] = []
        for f in findings:
            suppressed = False
            for line in {f.line, f.end_line}:
                codes = directives.get(line)
                if codes is None:
                    continue
                if not codes or f.code in codes:
                    suppressed = True
                    used[line].add(f.code)
                    break
            if not suppressed:
                kept.append(f)
        if report_unused:
            for line, codes in sorted(directives.items()):
                stale: list[tuple[str, str]] = []
                for code in codes:
                    # Codes of other tools, and of rules not enabled now, are not ours to
                    # judge; a trainlint code that no rule has can never suppress anything.
                    if code == INVALID:
                        why = (
                            "`noqa:` names no code, so it suppresses nothing (it is not a "
                            "bare `noqa`): name the codes, e.g. `# noqa: TL301`"
                        )
                    elif code not in self.known and code.startswith(OWN_PREFIX):
                        why = (
                            f"unknown rule code `{code}`: correct it (see `trainlint "
                            "rules`) or remove it"
                        )
                    elif code in self.enabled and code not in used[line]:
                        why = f"{code} is not reported on this line: remove it"
                    else:
                        continue
                    stale.append((code, why))
                text = source.lines[line - 1]
                edit = unused_codes_edit(text, line, {c for c, _ in stale})
                col = max(text.find("#") + 1, 1)
                for _code, why in stale:
                    f = self._meta_finding(
                        UNUSED_NOQA, path, line, col, f"unused `noqa` directive: {why}"
                    )
                    if edit is not None:
                        f = f._replace(fix=Fix("safe", (edit,), "remove the unused code"))
                    kept.append(f)
        return kept


def _builtincodes_of() -> frozenset[str]:
    from trainlint.rules import catalog_rules

    return frozenset(r.code for r in catalog_rules())


def _describe(exc: BaseException) -> str:
    import traceback

    tb = traceback.extract_tb(exc.__traceback__)
    where = f" ({tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"
