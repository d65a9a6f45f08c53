"""Which configuration each file is linted with: the nearest ``trainlint.toml`` or
``pyproject.toml`` with ``[tool.trainlint]`` at or above the file, as ruff does, or one
file forced for all (``--config``).

A file's findings must not depend on which other paths the command line named, nor in
what order: pre-commit hands a hook its files in batches of its own choosing. So the
configuration is looked up per file (once per directory), never from the first path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from trainlint.config import ConfigError, config_in, load_config
from trainlint.settings import Settings


def absolute(path: Path) -> Path:
    """``path`` resolved, or made absolute where it cannot be (a symlink loop, a
    dangling link, an unreadable parent): the lookup must never crash on a bad path."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return Path.cwd() / path


class ConfigTree:
    """The settings of each file of a run, each config file read once.

    ``forced``: the ``--config`` file, used for every file. ``adjust``: what the command
    line changes in every settings (``--exclude``), applied once per config file.
    """

    def __init__(
        self,
        forced: Path | None = None,
        adjust: Callable[[Settings], None] | None = None,
    ) -> None:
        if forced is not None and not forced.is_file():
            raise ConfigError(f"{forced}: config file not found")
        self.forced = forced
        self._adjust = adjust
        self._nearest: dict[Path, Path | None] = {}
        self._settings: dict[Path | None, Settings] = {}

    def config_of(self, path: Path) -> Path | None:
        """The config file that governs ``path`` (a file or a directory)."""
        if self.forced is not None:
            return self.forced
        full = absolute(path)
        directory = full if _is_dir(full) else full.parent
        return self._config_of_dir(directory)

    def _config_of_dir(self, directory: Path) -> Path | None:
        walked: list[Path] = []
        found: Path | None = None
        for d in (directory, *directory.parents):
            if d in self._nearest:
                found = self._nearest[d]
                break
            walked.append(d)
            found = config_in(d)
            if found is not None:
                break
        for d in walked:
            self._nearest[d] = found
        return found

    def settings_of_config(self, config: Path | None) -> Settings:
        if config not in self._settings:
            settings = load_config(config) if config is not None else Settings()
            if self._adjust is not None:
                self._adjust(settings)
            self._settings[config] = settings
        return self._settings[config]

    def settings_for(self, path: Path) -> Settings:
        """The effective settings of ``path``."""
        return self.settings_of_config(self.config_of(path))

    def group(self, files: Iterable[Path]) -> list[tuple[Settings, list[Path]]]:
        """``files`` by the config that governs each, in the order of first appearance."""
        groups: dict[Path | None, list[Path]] = {}
        for f in files:
            groups.setdefault(self.config_of(f), []).append(f)
        return [(self.settings_of_config(cfg), fs) for cfg, fs in groups.items()]


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False
