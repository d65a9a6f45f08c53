"""Whether a project ever reshuffles its distributed samplers: a file's part of the
project summary (does it call ``.set_epoch(...)``, does it build a `DistributedSampler`),
and what the project view tells a file that builds one. A loader that leaves its file
(returned by a helper, kept on an object, handed to another module) is iterated where
this file cannot see; if no file of the project calls ``set_epoch``, that place does not
reseed it either."""

from __future__ import annotations

import ast
import re

from trainlint.analysis.model import FileModel, is_false, keyword

DISTRIBUTED_SAMPLER = "torch.utils.data.DistributedSampler"
#: A file without these bytes has nothing to say about sampler epochs.
EPOCH_WORDS = (b"set_epoch", b"DistributedSampler")


def epoch_facts(model: FileModel) -> dict[str, bool]:
    """The file's part of the project summary: ``sets`` when it calls ``.set_epoch(...)``
    on anything, ``samples`` when it builds a `DistributedSampler` (only those files are
    told what the rest of the project does). Empty when neither."""
    out: dict[str, bool] = {}
    if model.calls.get("set_epoch"):
        out["sets"] = True
    if model.calls_to(DISTRIBUTED_SAMPLER):
        out["samples"] = True
    return out


def project_sets_epoch(model: FileModel) -> bool | None:
    """Does any file of the linted project call ``.set_epoch(...)``? None when the file was
    linted without a project view (on its own), or its view does not say."""
    view = model.project
    if not view or "sets_epoch" not in view:
        return None
    return bool(view["sets_epoch"])


# Identifier parts that name a held-out split: its order does not change what it measures.
_HELD_OUT = re.compile(r"^(val|valid|validation|test|eval|evaluation|dev|holdout)$", re.IGNORECASE)


def reads_held_out(model: FileModel, sampler: ast.Call, loaders: list[ast.Call]) -> bool:
    """Does the sampler read a held-out split: its name, or its dataset's, says so
    (``val_sampler``, ``DistributedSampler(test_set)``), or every loader that holds it
    says ``shuffle=False`` (the author wants one fixed pass)? Its order then changes
    nothing that is measured."""
    if loaders and all(is_false(keyword(c, "shuffle")) for c in loaders):
        return True
    spelled: list[ast.AST] = [sampler.args[0]] if sampler.args else []
    spelled += [kw.value for kw in sampler.keywords if kw.arg == "dataset"]
    parent = model.parent_of(sampler)
    if isinstance(parent, ast.Assign):
        spelled += parent.targets
    for node in spelled:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
        if name and any(_HELD_OUT.match(part) for part in name.split("_")):
            return True
    return False
