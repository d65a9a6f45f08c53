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


@dataclass(frozen=True)
class Fix:
    applicability: Applicability
    edits: tuple[Edit, ...]
    message: str = ""


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
