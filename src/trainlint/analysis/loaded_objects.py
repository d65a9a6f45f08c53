"""What a bare ``torch.load`` returns, told by what the other branch builds instead.

``agent = torch.load(cfg.agent_path)`` on one branch and ``agent = Agent(cfg.agent)`` on
the other: the name holds an ``Agent`` after the ``if``, so the checkpoint is a pickled
``Agent`` whoever saved it, and ``weights_only`` refuses it. Kept apart from the
save/load pairing in ``checkpoints``: this answer needs no save at all.
"""

from __future__ import annotations

import ast

from trainlint.analysis.checkpoints import TORCH_LOAD, Item, Save
from trainlint.analysis.model import FileModel, has_star_kwargs, keyword
from trainlint.analysis.roles import is_module_class


def loads_of_branch_objects(model: FileModel) -> dict[ast.Call, Save]:
    """Each load without ``weights_only`` assigned to a name that another branch of the
    same ``if``/``elif``/``else`` assigns an instance of a class of this file, with that
    object (a ``Save`` read from the code, ``read`` set)."""

    def build(m: FileModel) -> dict[ast.Call, Save]:
        out: dict[ast.Call, Save] = {}
        for call in m.calls_to(TORCH_LOAD):
            if keyword(call, "weights_only") is not None or has_star_kwargs(call):
                continue
            stmt = m.statement_of(call)
            if not isinstance(stmt, ast.Assign) or stmt.value is not call:
                continue
            for alt in m.flow.branch_alternatives(stmt):
                item = _class_instance(m, alt)
                if item is not None:
                    out[call] = Save(None, frozenset(), frozenset(), (item,), read=True)
                    break
        return out

    return model.memo(loads_of_branch_objects, build)


def _class_instance(model: FileModel, value: ast.expr) -> Item | None:
    """``Agent(...)`` for a module-level class ``Agent`` of this file: the object and
    what it is."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)):
        return None
    cls = model.class_named(value.func.id)
    if cls is None:
        return None
    if is_module_class(model, cls):
        kind = f"a whole `nn.Module` (line {value.lineno} builds one on the other branch)"
    else:
        kind = (
            f"an object of this file's class `{cls.name}` "
            f"(line {value.lineno} builds one on the other branch)"
        )
    return Item(None, cls.name, kind)
