"""The semantic model every rule shares: built once per file, queried by all rules.

Its modules sit in layers (:mod:`trainlint.analysis.layers`, docs/architecture.md).
"""

from trainlint.analysis.model import FileModel

__all__ = ["FileModel"]
