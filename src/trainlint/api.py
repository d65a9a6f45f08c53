"""The programmatic API: lint a string or paths, get :class:`Finding` objects back."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trainlint.config import Settings, select_rules
from trainlint.engine import Linter
from trainlint.findings import Finding
from trainlint.rules.base import Rule


def all_rules(settings: Settings | None = None, *, catalog: bool = False) -> list[type[Rule]]:
    """Every rule the settings know, in code order. ``catalog``: the built-ins as the
    catalog's stand-ins, each imported when it first checks a file (what linting needs)."""
    from trainlint.plugins.manager import load_rules

    if settings is None:
        return load_rules([], catalog=catalog)
    beside = str(settings.root) if settings.config_path is not None else None
    return load_rules(settings.plugins, catalog=catalog, beside=beside)


def lint_source(
    source: str | bytes,
    *,
    path: str = "<string>",
    select: Sequence[str] | None = None,
    ignore: Sequence[str] = (),
    options: dict[str, dict[str, Any]] | None = None,
) -> list[Finding]:
    """Lint one module's source. ``select``/``ignore`` take codes or prefixes."""
    settings = Settings(rule_options=dict(options or {}))
    selection = select_rules(
        all_rules(settings, catalog=True),
        settings,
        cli_select=list(select) if select is not None else None,
        cli_ignore=list(ignore),
    )
    data = source.encode("utf-8") if isinstance(source, str) else source
    result = Linter(selection).lint_bytes(data, path)
    if result.errors:
        raise RuntimeError("; ".join(str(e) for e in result.errors))
    return result.findings


def lint_paths(
    paths: Iterable[str | Path],
    *,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] = (),
    config: str | Path | None = None,
    jobs: int = 1,
) -> list[Finding]:
    """Lint files and directories, each with its own nearest configuration (or ``config``
    for all), like ``trainlint check``."""
    from trainlint.config_tree import ConfigTree
    from trainlint.discovery import discover
    from trainlint.runner import run

    path_list = [Path(p) for p in paths] or [Path.cwd()]
    tree = ConfigTree(Path(config) if config else None)
    findings: list[Finding] = []
    for settings, files in tree.group(discover(path_list, tree.settings_for)):
        selection = select_rules(
            all_rules(settings, catalog=True),
            settings,
            cli_select=list(select) if select is not None else None,
            cli_ignore=list(ignore),
        )
        findings.extend(run(files, selection, settings, jobs=jobs).findings)
    return sorted(findings, key=Finding.sort_key)
