"""The data a lint run produces: findings, fixes and edits (plain data, JSON-safe)."""

from __future__ import annotations

from typing import Any, Literal

from trainlint._record import Record

Severity = Literal["error", "warning"]
Applicability = Literal["safe", "unsafe"]


class Edit(Record, frozen=True):
    """Replace the text between two 1-based (line, column) positions with ``content``."""

    __slots__ = ("line", "column", "end_line", "end_column", "content")

    def __init__(
        self, line: int, column: int, end_line: int, end_column: int, content: str
    ) -> None:
        self.line = line
        self.column = column
        self.end_line = end_line
        self.end_column = end_column
        self.content = content


IntentKind = Literal["move", "wrap", "dedent"]


class Intent(Record, frozen=True):
    """A fix that restructures statements: what to do, on which sibling statements.

    The region runs from ``line, column`` (where its first statement starts) to
    ``end_line, end_column`` (where its last one ends) and holds ``count`` sibling
    statements of one block, one per line. Under ``--fix``/``--diff`` a libcst transform
    of that region carries the intent out and becomes an ordinary text edit
    (:mod:`trainlint.restructure`); a region it cannot transform safely stays unfixed.

    - ``move``: statements ``first..last`` (indices in the region) go just before
      statement ``to`` (``to == count``: after the last one).
    - ``wrap``: statements ``first..last`` become the body of ``with <header>:``.
    - ``dedent``: the region is one ``with`` statement; its body statements from
      ``first`` to the end move out, just after it.
    """

    __slots__ = (
        "kind",
        "line",
        "column",
        "end_line",
        "end_column",
        "count",
        "first",
        "last",
        "to",
        "header",
        "indent",
    )

    def __init__(
        self,
        kind: IntentKind,
        line: int,
        column: int,
        end_line: int,
        end_column: int,
        count: int,
        first: int,
        last: int,
        to: int = 0,
        header: str = "",
        indent: str = "    ",  # one level of indentation in this file (for ``wrap``)
    ) -> None:
        self.kind = kind
        self.line = line
        self.column = column
        self.end_line = end_line
        self.end_column = end_column
        self.count = count
        self.first = first
        self.last = last
        self.to = to
        self.header = header
        self.indent = indent

    def shifted(self, lines: int) -> Intent:
        """The same intent with its lines moved by ``lines`` (a notebook cell's offset)."""
        return self._replace(line=self.line + lines, end_line=self.end_line + lines)


class Fix(Record, frozen=True):
    """Edits that fix a finding; ``intent``: a restructuring fix, carried out with libcst
    only under --fix/--diff."""

    __slots__ = ("applicability", "edits", "message", "intent")

    def __init__(
        self,
        applicability: Applicability,
        edits: tuple[Edit, ...],
        message: str = "",
        intent: Intent | None = None,
    ) -> None:
        self.applicability = applicability
        self.edits = edits
        self.message = message
        self.intent = intent


class Related(Record, frozen=True):
    """Another place a finding involves (the `zero_grad()` a read comes after, the length
    argument of a schedule): shown under the finding and as SARIF `relatedLocations`."""

    __slots__ = ("line", "column", "end_line", "end_column", "message", "cell")

    def __init__(
        self,
        line: int,
        column: int,
        end_line: int,
        end_column: int,
        message: str,
        cell: int | None = None,
    ) -> None:
        self.line = line
        self.column = column
        self.end_line = end_line
        self.end_column = end_column
        self.message = message
        self.cell = cell


class Finding(Record):
    """One reported problem. Lines and columns are 1-based; columns count characters.
    ``extra`` (a rule's own data for its fix or report) is neither compared nor shown."""

    __slots__ = (
        "code",
        "name",
        "path",
        "line",
        "column",
        "end_line",
        "end_column",
        "message",
        "severity",
        "fix",
        "cell",
        "related",
        "extra",
    )
    _fields = __slots__[:-1]

    def __init__(
        self,
        code: str,
        name: str,
        path: str,
        line: int,
        column: int,
        end_line: int,
        end_column: int,
        message: str,
        severity: Severity = "error",
        fix: Fix | None = None,
        cell: int | None = None,
        related: tuple[Related, ...] = (),
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.code = code
        self.name = name
        self.path = path
        self.line = line
        self.column = column
        self.end_line = end_line
        self.end_column = end_column
        self.message = message
        self.severity = severity
        self.fix = fix
        self.cell = cell
        self.related = related
        self.extra = {} if extra is None else extra

    def sort_key(self) -> tuple[str, int, int, int, str]:
        # Notebook lines count from each cell's start: order by cell first.
        return (self.path, self.cell or 0, self.line, self.column, self.code)

    def to_dict(self) -> dict[str, Any]:
        data = self._asdict()
        if self.fix is None:
            data["fix"] = None
        elif self.fix.intent is None:
            data["fix"].pop("intent", None)  # text-only fixes keep their JSON shape
        if self.cell is None:
            data.pop("cell")
        if self.related:
            data["related"] = [
                {k: v for k, v in r._asdict().items() if k != "cell" or v is not None}
                for r in self.related
            ]
        else:
            data.pop("related")
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        fix = data.get("fix")
        fix_obj = None
        if fix:
            fix_obj = Fix(
                applicability=fix["applicability"],
                edits=tuple(Edit(**e) for e in fix["edits"]),
                message=fix.get("message", ""),
                intent=Intent(**fix["intent"]) if fix.get("intent") else None,
            )
        return cls(
            code=data["code"],
            name=data["name"],
            path=data["path"],
            line=data["line"],
            column=data["column"],
            end_line=data["end_line"],
            end_column=data["end_column"],
            message=data["message"],
            severity=data.get("severity", "error"),
            fix=fix_obj,
            cell=data.get("cell"),
            related=tuple(Related(**r) for r in data.get("related", ())),
        )


class InternalError(Record):
    """A rule (or the engine) raised on one file: reported, never fatal to the run."""

    __slots__ = ("path", "rule", "error")

    def __init__(self, path: str, rule: str, error: str) -> None:
        self.path = path
        self.rule = rule
        self.error = error

    def __str__(self) -> str:
        return f"{self.path}: internal error in {self.rule}: {self.error}"


class FileResult(Record):
    """What linting one file gave. ``syntax_error``: the text was rejected by the parser
    (whether or not TL001 is selected); ``summary``: the file's project summary
    (analysis.project), when the run asked for it; ``view``: the digest of the project
    view the findings assume ("" for none): a run keeps a file's first findings when the
    whole project's view of it is this one."""

    __slots__ = (
        "path",
        "findings",
        "errors",
        "timings",
        "parsed",
        "syntax_error",
        "fixed",
        "diff",
        "summary",
        "view",
    )

    def __init__(
        self,
        path: str,
        findings: list[Finding] | None = None,
        errors: list[InternalError] | None = None,
        timings: dict[str, float] | None = None,
        parsed: bool = False,
        syntax_error: bool = False,
        fixed: int = 0,
        diff: str = "",
        summary: dict[str, Any] | None = None,
        view: str = "",
    ) -> None:
        self.path = path
        self.findings = [] if findings is None else findings
        self.errors = [] if errors is None else errors
        self.timings = {} if timings is None else timings
        self.parsed = parsed
        self.syntax_error = syntax_error
        self.fixed = fixed
        self.diff = diff
        self.summary = summary
        self.view = view
