"""The semantic model every rule shares: built once per file, queried by all rules.

Its modules sit in layers (:mod:`trainlint.analysis.layers`, docs/architecture.md). This
package is the composition root: importing it imports the modules that answer the
upward questions of :mod:`trainlint.analysis.hooks`, so every slot is set before any
model is built.
"""

from trainlint.analysis import effects, flow, project_views, roles, steps  # noqa: F401  (set the hooks)
from trainlint.analysis.model import FileModel

__all__ = ["FileModel"]
