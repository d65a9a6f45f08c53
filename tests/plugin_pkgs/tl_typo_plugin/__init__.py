"""A plugin with a misspelled hook: rejected instead of silently ignored."""

from trainlint.plugins.hookspecs import hookimpl


@hookimpl
def trainlint_rule():
    return []
