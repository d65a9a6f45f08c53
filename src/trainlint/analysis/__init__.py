"""The semantic model every rule shares: built once per file, queried by all rules."""

from trainlint.analysis.model import FileModel

__all__ = ["FileModel"]
