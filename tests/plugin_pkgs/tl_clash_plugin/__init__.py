"""A plugin whose rule reuses a built-in code: loading must fail, naming both."""

from trainlint.plugins.hookspecs import hookimpl
from trainlint.rules.memory import RetainGraphInLoop


class Copy(RetainGraphInLoop):
    __doc__ = RetainGraphInLoop.__doc__
    name = "retain-graph-copy"


@hookimpl
def trainlint_rules():
    return [Copy]
