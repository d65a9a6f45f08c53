"""Load plugins (entry points + config), reject misspelled hooks and code clashes."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import pluggy

from trainlint.config import ConfigError
from trainlint.plugins import hookspecs
from trainlint.rules import builtin_rules
from trainlint.rules.base import Rule


@lru_cache(maxsize=8)
def _manager(plugins: tuple[str, ...]) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    except Exception as exc:
        raise ConfigError(f"failed to load a `trainlint` entry-point plugin: {exc!r}") from None
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


def load_rules(plugins: Sequence[str] = ()) -> list[type[Rule]]:
    pm = _manager(tuple(plugins))
    rules = builtin_rules()
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


def load_formats(plugins: Sequence[str] = ()) -> dict[str, Any]:
    pm = _manager(tuple(plugins))
    formats: dict[str, Any] = {}
    for result in pm.hook.trainlint_output_formats():
        formats.update(result or {})
    return formats
