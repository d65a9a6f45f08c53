"""Questions a lower layer asks that only a higher layer can answer (dependency inversion).

The layers of ``analysis/`` import only downwards (see :mod:`trainlint.analysis.layers`).
A few questions still run upwards: the file model hands out its roles and flow (built
in the values layer) and its step model (the meaning layer); roles ask the project view
what a name from another file is; the step walker asks what a call into another file
does. The lower module asks through :data:`ANSWERS`; the module that owns the answer
sets its slot when it is imported (``ANSWERS.roles = Roles`` at its end). A slot asked
is set by the time any model is built: the package's ``__init__`` (the composition root)
imports every module :data:`PROVIDERS` names. The lower layer knows the name of the
module that answers, never its code.

Each slot is typed here, so a caller knows what it gets without importing the answer.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlint.analysis.flow import Flow
    from trainlint.analysis.model import FileModel
    from trainlint.analysis.roles import Binding, Roles
    from trainlint.analysis.step_paths import Foreign
    from trainlint.analysis.steps import StepModel


#: Slot -> the module that sets it when imported.
PROVIDERS: dict[str, str] = {
    "roles": "trainlint.analysis.roles",
    "flow": "trainlint.analysis.flow",
    "steps": "trainlint.analysis.steps",
    "foreign_binding": "trainlint.analysis.project_views",
    "resolve_foreign": "trainlint.analysis.effects",
    "foreign_argument": "trainlint.analysis.effects",
    "foreign_paths": "trainlint.analysis.effects",
}


class Answers:
    """One slot per upward question; set by the module :data:`PROVIDERS` names."""

    # analysis.roles, analysis.flow, analysis.steps: the file model's lazy layers
    roles: Callable[[FileModel], Roles]
    flow: Callable[[FileModel], Flow]
    steps: Callable[[FileModel], StepModel]
    # analysis.project_views: the role an expression holds, known from other files
    foreign_binding: Callable[[FileModel, ast.AST], Binding | None]
    # analysis.effects: the view's entry for a call into another file (and its receiver),
    # the argument a call passes for one of that entry's parameters, and the events of
    # such a call as the step walker's paths
    resolve_foreign: Callable[[FileModel, ast.Call], tuple[dict[str, Any], ast.expr | None] | None]
    foreign_argument: Callable[[dict[str, Any], ast.Call, str], ast.expr | None]
    foreign_paths: Foreign

    def __getattr__(self, slot: str) -> Any:
        # Only reached while the slot is unset: its module was not imported (the package's
        # __init__ imports them all), a bug to name rather than to paper over.
        provider = PROVIDERS.get(slot)
        if provider is None:
            raise AttributeError(slot)
        raise AttributeError(f"ANSWERS.{slot} is unset: {provider} was not imported")


ANSWERS = Answers()
