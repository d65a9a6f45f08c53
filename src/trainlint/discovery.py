"""Which files to lint: explicit files always; directories walked with sensible skips.

Inside a git work tree, ``.gitignore`` is honoured by asking git itself
(``git ls-files --cached --others --exclude-standard``), so every gitignore
subtlety is right. Without git, the walk still skips VCS folders, virtualenvs,
build output and caches.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trainlint.config import Settings, path_matches, relative_posix

EXTENSIONS = (".py", ".pyi", ".ipynb")
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        "__pycache__",
        "node_modules",
        "build",
        "dist",
        ".tox",
        ".nox",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".eggs",
        "site-packages",
        ".ipynb_checkpoints",
        ".trainlint_cache",
    }
)


class DiscoveryError(Exception):
    """A named path does not exist."""


def _skip_dir(path: Path) -> bool:
    name = path.name
    if name in SKIP_DIRS or name.endswith(".egg-info"):
        return True
    return (path / "pyvenv.cfg").is_file()  # any virtualenv, whatever its name


#: The settings a path is judged by: one for the whole run, or each path's own (the
#: nearest config, ``config_tree.ConfigTree.settings_for``).
SettingsFor = Callable[[Path], Settings]


def is_excluded(path: Path, settings: Settings) -> bool:
    """Whether ``exclude``/``extend-exclude`` (relative to the config's directory) skip
    ``path`` or a directory above it."""
    patterns = [*settings.exclude, *settings.extend_exclude]
    if not patterns:
        return False
    rel = relative_posix(path, settings.root)
    return any(path_matches(rel, p) for p in patterns)


def _git_files(directory: Path) -> set[Path] | None:
    """Files git does not ignore under ``directory``, or None when git can't tell."""
    import shutil
    import subprocess  # (here: a check of named files never runs git)

    if shutil.which("git") is None:
        return None
    try:
        proc = subprocess.run(
            [
                "git",
                "-C",
                str(directory),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
                "--",
                ".",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    ignored = subprocess.run(
        ["git", "-C", str(directory), "check-ignore", "-q", "."],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if ignored.returncode == 0:
        return None  # the named directory itself is ignored: the user asked for it anyway
    base = directory.resolve()
    out = set()
    for raw in proc.stdout.split(b"\0"):
        if raw:
            out.add(base / os.fsdecode(raw))
    return out


def discover(
    paths: Iterable[str | Path],
    settings: Settings | SettingsFor,
    *,
    force_exclude: bool = False,
) -> Iterator[Path]:
    """Yield files to lint, each once, in a deterministic order. Files named explicitly
    are linted even when excluded, unless ``force_exclude`` (a pre-commit hook: it names
    every changed file). A file reached twice (through a symlink in the same tree, or
    named twice) is linted once."""
    settings_for: SettingsFor = settings if callable(settings) else (lambda _p: settings)
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists() and not path.is_symlink():
            raise DiscoveryError(f"{raw}: no such file or directory")
        if path.is_dir():
            walked = sorted(_walk(path, settings_for))
            # a link to a file the walk also reaches by its own name comes second
            walked.sort(key=lambda f: f.is_symlink())
            for f in walked:
                key = _identity(f)
                if key not in seen:
                    seen.add(key)
                    yield f
        else:
            if force_exclude and is_excluded(path, settings_for(path.parent)):
                continue
            key = _identity(path)
            if key not in seen:
                seen.add(key)
                yield path  # explicitly named files are linted unless force-excluded


def _identity(path: Path) -> Path:
    """What a path names: the file it resolves to, or itself (a dangling link, a loop)."""
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError):
        return path.absolute()


def _walk(directory: Path, settings_for: SettingsFor) -> Iterator[Path]:
    tracked = _git_files(directory)
    base = directory.resolve()
    for root, dirs, files in os.walk(directory, followlinks=False):
        root_path = Path(root)
        # what is in a directory is judged by the config that governs that directory
        settings = settings_for(root_path)
        keep = []
        for d in dirs:
            dpath = root_path / d
            if _skip_dir(dpath) or is_excluded(dpath, settings):
                continue
            keep.append(d)
        dirs[:] = sorted(keep)
        for name in files:
            if not name.endswith(EXTENSIONS):
                continue
            fpath = root_path / name
            if tracked is not None and base / fpath.relative_to(directory) not in tracked:
                continue  # ignored by .gitignore (git said so)
            if is_excluded(fpath, settings):
                continue
            yield fpath
