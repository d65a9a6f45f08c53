"""The semantic model every rule shares: built once per file, queried by all rules.

The package is the composition root of the layers (docs/architecture.md): importing it
imports the modules that answer the upward questions of :mod:`trainlint.analysis.hooks`,
so their answers are in place before any file model is built.
"""

from trainlint.analysis import effects, flow, project_views, roles, steps  # noqa: F401
from trainlint.analysis.model import FileModel

__all__ = ["FileModel"]
