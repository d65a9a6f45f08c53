"""The data a lint run produces: findings, fixes and edits (plain data, JSON-safe)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Severity = Literal["error", "warning"]
Applicability = Literal["safe", "unsafe"]


@dataclass(frozen=True)
class Edit:
    """Replace the text between two 1-based (line, column) positions with ``content``."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str


IntentKind = Literal["move", "wrap", "dedent"]


@dataclass(frozen=True)
class Intent:
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

    kind: IntentKind
    line: int
    column: int
    end_line: int
    end_column: int
    count: int
    first: int
    last: int
    to: int = 0
    header: str = ""
    #: one level of indentation in this file (for ``wrap``)
    indent: str = "    "

    def shifted(self, lines: int) -> Intent:
        """The same intent with its lines moved by ``lines`` (a notebook cell's offset)."""
        from dataclasses import replace

        return replace(self, line=self.line + lines, end_line=self.end_line + lines)


@dataclass(frozen=True)
class Fix:
    applicability: Applicability
    edits: tuple[Edit, ...]
    message: str = ""
    #: a restructuring fix, carried out with libcst only under --fix/--diff
    intent: Intent | None = None


@dataclass(frozen=True)
class Related:
    """Another place a finding involves (the `zero_grad()` a read comes after, the length
    argument of a schedule): shown under the finding and as SARIF `relatedLocations`."""

    line: int
    column: int
    end_line: int
    end_column: int
    message: str
    cell: int | None = None


@dataclass
class Finding:
    """One reported problem. Lines and columns are 1-based; columns count characters."""

    code: str
    name: str
    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    message: str
    severity: Severity = "error"
    fix: Fix | None = None
    cell: int | None = None
    related: tuple[Related, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def sort_key(self) -> tuple[str, int, int, int, str]:
        # Notebook lines count from each cell's start: order by cell first.
        return (self.path, self.cell or 0, self.line, self.column, self.code)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra", None)
        if self.fix is None:
            data["fix"] = None
        elif self.fix.intent is None:
            data["fix"].pop("intent", None)  # text-only fixes keep their JSON shape
        if self.cell is None:
            data.pop("cell")
        if self.related:
            data["related"] = [
                {k: v for k, v in asdict(r).items() if k != "cell" or v is not None}
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


@dataclass
class InternalError:
    """A rule (or the engine) raised on one file: reported, never fatal to the run."""

    path: str
    rule: str
    error: str

    def __str__(self) -> str:
        return f"{self.path}: internal error in {self.rule}: {self.error}"
