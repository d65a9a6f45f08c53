"""Machinery behind :mod:`trainlint.testing`: recorders, probes and failure reports.

Private: import the checks from :mod:`trainlint.testing`. Modules here that need torch
(``steps``, ``memory``, ``arguments``) import it at module level, and the checks import them
only when called; ``links`` and ``report`` are torch-free and imported with the checks.
"""
