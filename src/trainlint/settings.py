"""The effective configuration of a run, and the rules it selects: plain data, built by
:mod:`trainlint.config` from the command line and ``pyproject.toml``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainlint._record import Record

if TYPE_CHECKING:
    from trainlint.rules.base import Rule


class Settings(Record):
    """The effective configuration. ``target_torch``: ``target-torch`` as written
    ("2.6"); None: read each file's project pin instead."""

    __slots__ = (
        "select",
        "ignore",
        "extend_select",
        "exclude",
        "extend_exclude",
        "per_file_ignores",
        "jobs",
        "cache_dir",
        "plugins",
        "rule_options",
        "target_torch",
        "root",
        "config_path",
    )

    def __init__(
        self,
        select: list[str] | None = None,
        ignore: list[str] | None = None,
        extend_select: list[str] | None = None,
        exclude: list[str] | None = None,
        extend_exclude: list[str] | None = None,
        per_file_ignores: dict[str, list[str]] | None = None,
        jobs: int | None = None,
        cache_dir: str | None = None,
        plugins: list[str] | None = None,
        rule_options: dict[str, dict[str, Any]] | None = None,
        target_torch: str | None = None,
        root: Path | None = None,
        config_path: Path | None = None,
    ) -> None:
        self.select = select
        self.ignore = [] if ignore is None else ignore
        self.extend_select = [] if extend_select is None else extend_select
        self.exclude = [] if exclude is None else exclude
        self.extend_exclude = [] if extend_exclude is None else extend_exclude
        self.per_file_ignores = {} if per_file_ignores is None else per_file_ignores
        self.jobs = jobs
        self.cache_dir = cache_dir
        self.plugins = [] if plugins is None else plugins
        self.rule_options = {} if rule_options is None else rule_options
        self.target_torch = target_torch
        self.root = Path.cwd() if root is None else root
        self.config_path = config_path

    def origin(self) -> str:
        return str(self.config_path) if self.config_path else "command line"


class RuleSelection(Record):
    """Resolved selection: which rule classes run, with their options; ``known``: every
    code the run knows (selected or not, plugins included), empty for the built-ins."""

    __slots__ = ("rules", "options", "known")

    def __init__(
        self,
        rules: list[type[Rule]],
        options: dict[str, dict[str, Any]],
        known: frozenset[str] = frozenset(),
    ) -> None:
        self.rules = rules
        self.options = options
        self.known = known

    @property
    def codes(self) -> set[str]:
        return {r.code for r in self.rules}
