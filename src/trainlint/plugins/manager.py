"""Load plugins (entry points + config), reject misspelled hooks and code clashes."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from functools import lru_cache
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING, Any

from trainlint.config import ConfigError
from trainlint.rules import builtin_rules, catalog_rules
from trainlint.rules.base import Rule

if TYPE_CHECKING:
    import pluggy

#: The entry-point group plugins declare (hookspecs.PROJECT, without importing pluggy).
GROUP = "trainlint"


def entry_point_plugins_possible() -> bool:
    """Whether an installed distribution may declare a ``trainlint`` entry point.

    pluggy's scan imports ``importlib.metadata`` and parses every distribution's
    metadata: most of the start-up time of a one-file check, usually to find nothing.
    This lists the metadata directories on ``sys.path`` and reads their
    ``entry_points.txt`` (about a millisecond); anything it cannot read as cheaply (a
    zip or egg on the path, a custom distribution finder, a file naming ``trainlint``)
    answers True and the full scan decides.
    """
    for finder in sys.meta_path:
        if finder is not PathFinder and hasattr(finder, "find_distributions"):
            return True
    needle = GROUP.encode()
    for entry in sys.path:
        path = entry or "."
        if not os.path.isdir(path):
            if os.path.exists(path):
                return True  # a zip file on the path
            continue
        if path.lower().endswith(".egg"):
            return True
        try:
            names = os.listdir(path)
        except OSError:
            continue
        for name in names:
            if name.lower().endswith((".dist-info", ".egg-info")):
                try:
                    with open(os.path.join(path, name, "entry_points.txt"), "rb") as fh:
                        text = fh.read()
                except OSError:
                    continue
                if needle in text and _declares_group(text):
                    return True
    return False


def _declares_group(text: bytes) -> bool:
    """A ``[trainlint]`` section header (trainlint's own console script and pytest11
    entries also name it, in other sections). Looser than importlib.metadata's reading."""
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(b"[") and line.endswith(b"]") and line.strip(b"[] \t") == GROUP.encode():
            return True
    return False


@lru_cache(maxsize=8)
def _manager(plugins: tuple[str, ...], beside: str | None = None) -> pluggy.PluginManager | None:
    """The plugin manager, or None when there is no plugin to load (pluggy not imported).
    ``beside``: the directory of the config naming ``plugins``: a plugin module kept next
    to its ``pyproject.toml`` imports without PYTHONPATH (searched after everything else,
    so a project's files never shadow an installed module)."""
    if not plugins and not entry_point_plugins_possible():
        return None
    import pluggy

    from trainlint.plugins import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    except Exception as exc:
        raise ConfigError(f"failed to load a `trainlint` entry-point plugin: {exc!r}") from None
    if plugins and beside and beside not in sys.path:
        sys.path.append(beside)
    for name in plugins:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(f"cannot import plugin `{name}` (from `plugins`): {exc!r}") from None
        if pm.get_plugin(name) is None and not pm.is_registered(module):
            pm.register(module, name=name)
    try:
        pm.check_pending()  # a hook named trainlint_* that no spec knows: a typo
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"invalid plugin: {exc}") from None
    return pm


def _origin(pm: pluggy.PluginManager, impl: Any) -> str:
    return pm.get_name(impl.plugin) or repr(impl.plugin)


def load_rules(
    plugins: Sequence[str] = (), *, catalog: bool = False, beside: str | None = None
) -> list[type[Rule]]:
    """The built-in rules and the plugins' rules, in code order. ``catalog``: the built-ins
    as the catalog's stand-ins (no rule module imported; see ``rules.CatalogRule``);
    ``beside``: the directory of the config that names ``plugins``."""
    pm = _manager(tuple(plugins), beside)
    rules = catalog_rules() if catalog else builtin_rules()
    if pm is None:
        return sorted(rules, key=lambda r: r.code)
    owner = {r.code: "trainlint (built-in)" for r in rules}
    for impl in pm.hook.trainlint_rules.get_hookimpls():
        origin = _origin(pm, impl)
        provided: Any = impl.function() or []
        for rule in provided:
            if not (isinstance(rule, type) and issubclass(rule, Rule)):
                raise ConfigError(f"plugin `{origin}` returned {rule!r}, not a Rule subclass")
            problems = rule.validate_metadata()
            if problems:
                raise ConfigError(f"plugin `{origin}`: {problems[0]}")
            if rule.code in owner:
                raise ConfigError(
                    f"rule code {rule.code} is defined by both {owner[rule.code]} and "
                    f"plugin `{origin}`"
                )
            owner[rule.code] = f"plugin `{origin}`"
            if rule.origin == "trainlint":
                rule.origin = origin
            rules.append(rule)
    return sorted(rules, key=lambda r: r.code)


def load_formats(plugins: Sequence[str] = (), beside: str | None = None) -> dict[str, Any]:
    pm = _manager(tuple(plugins), beside)
    formats: dict[str, Any] = {}
    if pm is None:
        return formats
    for result in pm.hook.trainlint_output_formats():
        formats.update(result or {})
    return formats
