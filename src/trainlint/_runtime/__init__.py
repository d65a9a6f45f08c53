"""Machinery behind :mod:`trainlint.testing`: recorders, probes and failure reports.

Private: import the checks from :mod:`trainlint.testing`. Modules here that need torch import
it at module level; :mod:`trainlint.testing` imports them only inside its checks.
"""
