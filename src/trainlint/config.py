"""Find, validate and merge configuration: ``[tool.trainlint]`` or ``trainlint.toml``.

Every problem is a :class:`ConfigError` naming the key and the file; the CLI turns
it into one line on stderr and exit status 2.
"""

from __future__ import annotations

import fnmatch
import importlib
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trainlint.rules.base import Rule
from trainlint.settings import RuleSelection, Settings
from trainlint.torch_pin import TorchPin, TorchPins, torch_requirement

__all__ = ["TorchPin", "TorchPins", "torch_requirement"]  # (the pin is read in torch_pin)

KNOWN_KEYS = {
    "select",
    "ignore",
    "extend-select",
    "exclude",
    "extend-exclude",
    "per-file-ignores",
    "jobs",
    "cache-dir",
    "plugins",
    "rules",
    "target-torch",
}

#: The key (in ``[tool.trainlint]``, and as an option of the rules that read it) naming the
#: oldest torch release the project supports, as "2.6".
TARGET_TORCH = "target-torch"
#: The oldest torch trainlint considers: a project that neither sets ``target-torch`` nor
#: pins torch anywhere (see ``torch_pin``) is assumed to run on it.
OLDEST_TORCH = "2.1"
_TORCH_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)(?:\.\d+)?\s*$")


def _toml() -> Any:  # imported on first use: a check outside any project reads no TOML
    return importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")


class ConfigError(Exception):
    """Bad configuration or usage; the message names the key and where it came from."""


def find_config(start: Path) -> Path | None:
    """Nearest ``trainlint.toml``, or ``pyproject.toml`` with ``[tool.trainlint]``, upwards."""
    try:
        cur = start.resolve()
        if cur.is_file() or not cur.exists():
            cur = cur.parent
    except (OSError, RuntimeError):  # a symlink loop, an unreadable parent
        cur = (Path.cwd() / start).parent
    for directory in (cur, *cur.parents):
        found = config_in(directory)
        if found is not None:
            return found
    return None


def config_in(directory: Path) -> Path | None:
    """``directory``'s own config file: ``trainlint.toml``, else a ``pyproject.toml``
    with a ``[tool.trainlint]`` table."""
    candidate = directory / "trainlint.toml"
    if candidate.is_file():
        return candidate
    candidate = directory / "pyproject.toml"
    if not candidate.is_file():
        return None
    try:
        text = candidate.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if "trainlint" not in text:
        return None  # (most projects' pyproject: no need to parse it)
    try:
        data = _toml().loads(text)
    except _toml().TOMLDecodeError as exc:
        if "tool.trainlint" in text:
            raise ConfigError(f"{candidate}: invalid TOML: {exc}") from None
        return None  # someone else's broken pyproject is not our config
    return candidate if "trainlint" in data.get("tool", {}) else None


def load_config(path: Path) -> Settings:
    try:
        data = _toml().loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    except (UnicodeDecodeError, _toml().TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    if path.name == "pyproject.toml":
        table = data.get("tool", {}).get("trainlint", {})
        prefix = "tool.trainlint."
    else:
        table = data.get("tool", {}).get("trainlint", data)
        prefix = ""
    return settings_from_table(table, path, prefix)


def _str_list(value: Any, key: str, path: Path) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: `{key}` must be a list of strings")
    return list(value)


def settings_from_table(table: dict[str, Any], path: Path, prefix: str = "") -> Settings:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: `{prefix.rstrip('.') or 'trainlint'}` must be a table")
    for key in table:
        if key not in KNOWN_KEYS:
            hint = ""
            if key.replace("_", "-") in KNOWN_KEYS:
                hint = f" (did you mean `{key.replace('_', '-')}`?)"
            raise ConfigError(f"{path}: unknown key `{prefix}{key}`{hint}")
    s = Settings(root=path.parent.resolve(), config_path=path)
    if "select" in table:
        s.select = _str_list(table["select"], prefix + "select", path)
    s.ignore = _str_list(table.get("ignore", []), prefix + "ignore", path)
    s.extend_select = _str_list(table.get("extend-select", []), prefix + "extend-select", path)
    s.exclude = _str_list(table.get("exclude", []), prefix + "exclude", path)
    s.extend_exclude = _str_list(table.get("extend-exclude", []), prefix + "extend-exclude", path)
    s.plugins = _str_list(table.get("plugins", []), prefix + "plugins", path)
    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{path}: `{prefix}per-file-ignores` must be a table")
    for pattern, codes in pfi.items():
        s.per_file_ignores[pattern] = _str_list(codes, f"{prefix}per-file-ignores.{pattern}", path)
    if "jobs" in table:
        jobs = table["jobs"]
        if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 0:
            raise ConfigError(f"{path}: `{prefix}jobs` must be a non-negative integer")
        s.jobs = jobs
    if "cache-dir" in table:
        if not isinstance(table["cache-dir"], str):
            raise ConfigError(f"{path}: `{prefix}cache-dir` must be a string")
        s.cache_dir = table["cache-dir"]
    if TARGET_TORCH in table:
        s.target_torch = _torch_setting(table[TARGET_TORCH], prefix + TARGET_TORCH, path)
    rules = table.get("rules", {})
    if not isinstance(rules, dict):
        raise ConfigError(f"{path}: `{prefix}rules` must be a table of rule codes")
    for code, opts in rules.items():
        if not isinstance(opts, dict):
            raise ConfigError(f"{path}: `{prefix}rules.{code}` must be a table")
        s.rule_options[code] = dict(opts)
    return s


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def _check_selectors(
    selectors: Iterable[str], all_rules: Sequence[type[Rule]], key: str, origin: str
) -> None:
    for sel in selectors:
        if not any(_matches(sel, r.code) for r in all_rules):
            raise ConfigError(f"{origin}: unknown rule code or prefix `{sel}` in `{key}`")


def select_rules(
    all_rules: Sequence[type[Rule]],
    settings: Settings,
    *,
    cli_select: list[str] | None = None,
    cli_ignore: list[str] | None = None,
    cli_extend_select: list[str] | None = None,
) -> RuleSelection:
    """Ruff-like selection: the most specific matching selector wins; ties go to ignore."""
    origin = settings.origin()
    _check_selectors(settings.select or [], all_rules, "select", origin)
    _check_selectors(settings.ignore, all_rules, "ignore", origin)
    _check_selectors(settings.extend_select, all_rules, "extend-select", origin)
    for pattern, codes in settings.per_file_ignores.items():
        _check_selectors(codes, all_rules, f'per-file-ignores."{pattern}"', origin)
    for key, values in (
        ("--select", cli_select or []),
        ("--ignore", cli_ignore or []),
        ("--extend-select", cli_extend_select or []),
    ):
        _check_selectors(values, all_rules, key, "command line")
    select = cli_select if cli_select is not None else settings.select
    ignore = [*settings.ignore, *(cli_ignore or [])]
    extend = [*settings.extend_select, *(cli_extend_select or [])]
    chosen: list[type[Rule]] = []
    for rule in all_rules:
        if select is None:
            sel_len = 0 if rule.default_enabled else -1
        else:
            sel_len = max((len(s) for s in select if _matches(s, rule.code)), default=-1)
        ext_len = max((len(s) for s in extend if _matches(s, rule.code)), default=-1)
        sel_len = max(sel_len, ext_len)
        ign_len = max((len(s) for s in ignore if _matches(s, rule.code)), default=-1)
        if sel_len >= 0 and sel_len > ign_len:
            chosen.append(rule)
    by_code = {r.code: r for r in all_rules}
    options: dict[str, dict[str, Any]] = {}
    for code, opts in settings.rule_options.items():
        rule_cls = by_code.get(code)
        if rule_cls is None:
            raise ConfigError(f"{origin}: unknown rule code `{code}` in `rules.{code}`")
        for key, value in opts.items():
            if key not in rule_cls.options:
                known = ", ".join(sorted(rule_cls.options)) or "none"
                raise ConfigError(
                    f"{origin}: unknown option `rules.{code}.{key}` (known options: {known})"
                )
            default = rule_cls.options[key]
            if key == TARGET_TORCH:
                _torch_setting(value, f"rules.{code}.{key}", origin)
            elif default is not None and not isinstance(value, type(default)):
                raise ConfigError(
                    f"{origin}: `rules.{code}.{key}` must be {type(default).__name__}"
                )
        options[code] = dict(opts)
    if settings.target_torch is not None:
        # The project-wide setting reaches the rules that read it as their option (a
        # rule's own table wins), so it is part of the options the cache is keyed on.
        for rule_cls in chosen:
            if TARGET_TORCH in rule_cls.options:
                options.setdefault(rule_cls.code, {}).setdefault(
                    TARGET_TORCH, settings.target_torch
                )
    return RuleSelection(chosen, options, frozenset(by_code))


def per_file_ignored(settings: Settings, path: Path) -> set[str]:
    """Selectors ignored for this file by ``per-file-ignores``."""
    if not settings.per_file_ignores:
        return set()
    rel = relative_posix(path, settings.root)
    out: set[str] = set()
    for pattern, codes in settings.per_file_ignores.items():
        if path_matches(rel, pattern):
            out.update(codes)
    return out


def relative_posix(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def path_matches(rel: str, pattern: str) -> bool:
    """gitignore-ish glob match: against the whole relative path, any suffix, or a parent."""
    pattern = pattern.rstrip("/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    if fnmatch.fnmatchcase(rel, pattern):
        return True
    parts = rel.split("/")
    if "/" not in pattern:
        return any(fnmatch.fnmatchcase(p, pattern) for p in parts)
    return any(fnmatch.fnmatchcase("/".join(parts[:i]), pattern) for i in range(1, len(parts)))


# -- the torch version a project targets ------------------------------------------------


def _torch_setting(value: Any, key: str, where: Path | str) -> str:
    if not isinstance(value, str) or not _TORCH_VERSION_RE.match(value):
        raise ConfigError(f'{where}: `{key}` must be a torch version string like "2.6"')
    return value.strip()


def torch_version(text: str) -> tuple[int, int]:
    """``"2.6"`` or ``"2.6.1"`` -> ``(2, 6)``; the text is one ``_torch_setting`` accepted."""
    m = _TORCH_VERSION_RE.match(text)
    if m is None:
        raise ValueError(f"not a torch version: {text!r}")
    return int(m.group(1)), int(m.group(2))
