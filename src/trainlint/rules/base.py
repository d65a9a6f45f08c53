"""The Rule base class: metadata, embedded examples, and a ``check`` over the FileModel.

Third-party rule packs subclass exactly this class and test themselves with
:mod:`trainlint.rule_testing`, the same harness our own rules use.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any, ClassVar

from trainlint._record import Record
from trainlint.analysis.model import FileModel
from trainlint.findings import Applicability, Edit, Fix, Intent, Severity

DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead")
OPTIONAL_SECTIONS = ("Fix safety", "Options", "References")
_CODE_RE = re.compile(r"^[A-Z]+[0-9]{3,4}$")


class Valid(Record, frozen=True):
    """An example that must produce no finding of the rule."""

    __slots__ = ("source", "options", "path")

    def __init__(
        self, source: str, options: dict[str, Any] | None = None, path: str = "example.py"
    ) -> None:
        self.source = source
        self.options = {} if options is None else options
        self.path = path


class Invalid(Record, frozen=True):
    """An example that must produce exactly the given findings of the rule.

    ``line`` (1-based) and optional ``column`` locate the single expected finding;
    ``lines`` lists several. ``fixed`` is the text after applying the rule's fixes
    (safe and unsafe), for fixable rules.
    """

    __slots__ = ("source", "line", "column", "lines", "fixed", "options", "path")

    def __init__(
        self,
        source: str,
        line: int | None = None,
        column: int | None = None,
        lines: tuple[int, ...] = (),
        fixed: str | None = None,
        options: dict[str, Any] | None = None,
        path: str = "example.py",
    ) -> None:
        self.source = source
        self.line = line
        self.column = column
        self.lines = lines
        self.fixed = fixed
        self.options = {} if options is None else options
        self.path = path

    def expected_lines(self) -> tuple[int, ...]:
        if self.lines:
            return self.lines
        return (self.line,) if self.line is not None else ()


class Report(Record):
    """What a rule yields: a node (or explicit span) and a message; the engine adds
    positions. ``related``: other places the finding involves, as (node, what it is),
    e.g. (the zero_grad call, "gradients cleared here")."""

    __slots__ = ("node", "message", "severity", "fix", "span", "related")

    def __init__(
        self,
        node: ast.AST | None,
        message: str,
        severity: Severity,
        fix: Fix | None = None,
        span: tuple[int, int, int, int] | None = None,
        related: tuple[tuple[ast.AST, str], ...] = (),
    ) -> None:
        self.node = node
        self.message = message
        self.severity = severity
        self.fix = fix
        self.span = span
        self.related = related


class Rule:
    """Base class of every rule. Subclasses set the metadata and implement :meth:`check`.

    The class docstring is the rule's documentation, in Ruff's sections:
    ``## What it does``, ``## Why is this bad?``, ``## Example``, ``## Use instead``,
    and where relevant ``## Fix safety``, ``## Options``, ``## References``.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    message: ClassVar[str]
    severity: ClassVar[Severity] = "error"
    default_enabled: ClassVar[bool] = True
    #: Substrings at least one of which must occur in the file for the rule to run.
    #: Empty means "always run" (use sparingly: it defeats the pre-filter).
    triggers: ClassVar[tuple[str, ...]] = ()
    fix_safety: ClassVar[Applicability | None] = None
    #: The runtime check in :mod:`trainlint.testing` that confirms a finding.
    confirm_with: ClassVar[str | None] = None
    #: False: the rule does not run on test files (``tests/``, ``test_*.py``, ``*_test.py``,
    #: ``conftest.py``), where the pattern it reports is usually done on purpose. Shown in
    #: the rule's documentation.
    test_files: ClassVar[bool] = True
    #: Option name -> default value; set in ``[tool.trainlint.rules.<CODE>]``.
    options: ClassVar[dict[str, Any]] = {}
    valid: ClassVar[list[str | Valid]] = []
    invalid: ClassVar[list[Invalid]] = []
    #: Set by the plugin manager for third-party rules.
    origin: ClassVar[str] = "trainlint"

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.opts: dict[str, Any] = {**self.options, **(options or {})}

    def check(self, model: FileModel) -> Iterable[Report]:
        raise NotImplementedError

    # -- helpers for subclasses ----------------------------------------------------------
    def report(
        self,
        node: ast.AST,
        message: str | None = None,
        *,
        fix: Fix | None = None,
        related: tuple[tuple[ast.AST, str], ...] = (),
    ) -> Report:
        # The severity is the rule's: `trainlint rules`, SARIF and every finding agree.
        return Report(node, message or self.message, self.severity, fix, related=related)

    def fix(self, *edits: Edit, message: str = "", intent: Intent | None = None) -> Fix:
        assert self.fix_safety is not None, f"{self.code} declares no fix_safety"
        return Fix(self.fix_safety, tuple(edits), message, intent)

    def restructure(self, intent: Intent | None, message: str) -> Fix | None:
        """A fix that moves, wraps or dedents statements (None: leave it unfixed)."""
        return self.fix(message=message, intent=intent) if intent is not None else None

    # -- documentation -------------------------------------------------------------------
    @classmethod
    def doc_sections(cls) -> dict[str, str]:
        import textwrap  # (documentation only: a check never reads it)

        doc = textwrap.dedent("\n".join((cls.__doc__ or "").splitlines()[1:]))
        first = (cls.__doc__ or "").splitlines()[0] if cls.__doc__ else ""
        doc = first.strip() + "\n" + doc
        sections: dict[str, str] = {}
        current: str | None = None
        buf: list[str] = []
        for raw in doc.splitlines():
            line = raw.rstrip()
            if line.startswith("## "):
                if current is not None:
                    sections[current] = "\n".join(buf).strip("\n")
                current = line[3:].strip()
                buf = []
            elif current is not None:
                buf.append(line)
        if current is not None:
            sections[current] = "\n".join(buf).strip("\n")
        return sections

    @classmethod
    def documentation(cls) -> str:
        """The rule's page as Markdown (what `trainlint rule CODE` prints)."""
        lines = [f"# {cls.name} ({cls.code})", ""]
        state = "on" if cls.default_enabled else "off"
        meta = [f"Default: {state}", f"Severity: {cls.severity}"]
        if cls.fix_safety:
            meta.append(f"Fix: {cls.fix_safety}")
        else:
            meta.append("Fix: none")
        if cls.confirm_with:
            meta.append(f"Confirmed at runtime by: `{cls.confirm_with}`")
        if not cls.test_files:
            meta.append("Not run on test files")
        if cls.origin != "trainlint":
            meta.append(f"From plugin: {cls.origin}")
        lines.append(" · ".join(meta))
        lines.append("")
        for title, body in cls.doc_sections().items():
            lines.extend([f"## {title}", "", body, ""])
        if cls.options and "Options" not in cls.doc_sections():
            lines.extend(["## Options", ""])
            for key, default in cls.options.items():
                lines.append(f"- `{key}` (default `{default!r}`)")
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"

    @classmethod
    def validate_metadata(cls) -> list[str]:
        """Problems with the class's metadata (used by meta tests and the plugin manager)."""
        problems = []
        for attr in ("code", "name", "message"):
            if not isinstance(getattr(cls, attr, None), str):
                problems.append(f"{cls.__name__}: missing `{attr}`")
        code = getattr(cls, "code", "")
        if isinstance(code, str) and not _CODE_RE.match(code):
            problems.append(f"{cls.__name__}: code {code!r} is not like 'TL101'")
        sections = cls.doc_sections()
        for title in DOC_SECTIONS:
            if title not in sections:
                problems.append(f"{code}: docs lack section '## {title}'")
        if cls.fix_safety and "Fix safety" not in sections:
            problems.append(f"{code}: fixable rule lacks '## Fix safety'")
        if cls.severity not in ("error", "warning"):
            problems.append(f"{code}: bad severity {cls.severity!r}")
        if cls.fix_safety not in (None, "safe", "unsafe"):
            problems.append(f"{code}: bad fix_safety {cls.fix_safety!r}")
        return problems
