"""trainlint: catch the bugs that make neural-network training fail silently.

Public API: the version, :func:`lint_source`, :func:`lint_paths`, :class:`Rule`
and :class:`Finding`. Nothing here imports torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Finding", "Rule", "__version__", "lint_paths", "lint_source"]


def __getattr__(name: str):  # lazy: keep `import trainlint` cheap for the pytest plugin
    if name in ("lint_source", "lint_paths"):
        from trainlint import api

        return getattr(api, name)
    if name == "Finding":
        from trainlint.findings import Finding

        return Finding
    if name == "Rule":
        from trainlint.rules.base import Rule

        return Rule
    raise AttributeError(name)
