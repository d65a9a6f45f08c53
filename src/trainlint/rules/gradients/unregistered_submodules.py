"""TL106 unregistered-submodules."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name, walk_local, walk_tree
from trainlint.analysis.roles import is_module_class, nn_prefix
from trainlint.analysis.submodules import (
    holds_module_construction,
    module_elements,
    rebound_to_registered,
)
from trainlint.rules.base import Invalid, Report, Rule


class UnregisteredSubmodules(Rule):
    """## What it does
    Flags an `nn.Module` that stores submodules in a plain `list`, `tuple` or `dict`
    attribute (`self.layers = [nn.Linear(...) for _ in range(n)]`). Parameter-free data
    transforms (torchaudio/torchvision transforms, or same-file wrappers holding only
    those) are not reported: nothing of theirs can go untrained or unsaved.

    ## Why is this bad?
    `nn.Module` registers only attributes that are modules themselves. Modules inside a
    plain container are invisible to `.parameters()`, so the optimizer never updates
    them; `.to(device)` leaves them on the CPU; `state_dict()` does not save them;
    `.train()`/`.eval()` do not reach them. The model trains with those layers frozen at
    their random initialisation, silently.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(64, 64) for _ in range(4)]
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(4)])
    ```

    ## Fix safety
    Wrapping the container in `nn.ModuleList` / `nn.ModuleDict` is safe: indexing,
    iteration and `len()` keep working, and the submodules become registered. Dicts
    whose keys are not all string literals are reported without a fix (`nn.ModuleDict`
    needs string keys).

    ## References
    - [torch.nn.ModuleList](https://pytorch.org/docs/stable/generated/torch.nn.ModuleList.html)
    """

    code = "TL106"
    name = "unregistered-submodules"
    message = "submodules in a plain container are not registered: invisible to `.parameters()`, `.to()`, `state_dict()`; use `nn.ModuleList`/`nn.ModuleDict`"
    triggers = ("Module",)
    fix_safety = "safe"
    confirm_with = None  # its parameters are invisible to every check
    valid = [
        """
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
""",
        # a plain list that is then registered through nn.Sequential
        """
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Linear(4, 4), nn.ReLU()]
        self.layers = [nn.Linear(4, 4), nn.ReLU()]
        self.net = nn.Sequential(*self.layers)
""",
        # a plain list used only as a builder, then rebound to a registering wrapper
        """
from torch import nn
class Pyramid(nn.Module):
    def __init__(self, scales):
        super().__init__()
        self.branches = []
        for s in scales:
            self.branches.append(nn.Sequential(nn.AdaptiveAvgPool2d(s), nn.Conv2d(8, 2, 1)))
        self.branches = nn.ModuleList(self.branches)
        self.heads = [nn.Linear(4, 4), nn.Linear(4, 2)]
        self.heads = nn.Sequential(*self.heads)
""",
        # plain data in a list
        """
from torch import nn
class Net(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.sizes = [64, 128, 256]
        self.names = {"a": "relu"}
""",
        # parameter-free transforms (a same-file wrapper around a torchaudio resampler)
        # held in a list: nothing to train or to save
        """
import torch
import torchaudio

class Resampler(torch.nn.Module):
    def __init__(self, orig, new):
        super().__init__()
        self.kernel = torchaudio.transforms.Resample(orig, new)

    def forward(self, wav):
        self.kernel.to(wav.device)
        return self.kernel(wav)

class RandomSpeed(torch.nn.Module):
    def __init__(self, speeds):
        super().__init__()
        self.resamplers = []
        for s in speeds:
            self.resamplers.append(Resampler(s, 100))
""",
        # not an nn.Module: a plain container class
        """
from torch import nn
class Bag:
    def __init__(self):
        self.parts = [nn.Linear(2, 2), nn.Linear(2, 2)]
""",
        # no torch: a local `nn` namespace
        """
class Net(Base):
    def __init__(self):
        self.blocks = [Block() for _ in range(3)]
""",
    ]
    invalid = [
        # filled in a loop from a name bound a line earlier
        Invalid(
            """
import torch

class Filters(torch.nn.Module):
    def __init__(self, scales):
        super().__init__()
        self.convs = []
        for k in scales:
            conv = torch.nn.Conv1d(1, 4, kernel_size=k)
            self.convs.append(conv)
""",
            line=6,
            fixed="""
import torch

class Filters(torch.nn.Module):
    def __init__(self, scales):
        super().__init__()
        self.convs = torch.nn.ModuleList()
        for k in scales:
            conv = torch.nn.Conv1d(1, 4, kernel_size=k)
            self.convs.append(conv)
""",
        ),
        Invalid(
            """
from torch import nn

class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = [nn.Linear(64, 64) for _ in range(n)]
""",
            line=6,
            fixed="""
from torch import nn

class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(n)])
""",
        ),
        Invalid(
            """
import torch

class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = {"cls": torch.nn.Linear(8, 3), "box": torch.nn.Linear(8, 4)}
""",
            line=6,
            fixed="""
import torch

class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = torch.nn.ModuleDict({"cls": torch.nn.Linear(8, 3), "box": torch.nn.Linear(8, 4)})
""",
        ),
        # an empty list filled with append
        Invalid(
            """
import torch.nn as nn

class Block(nn.Module):
    pass

class Tower(Block):
    def __init__(self, depth):
        super().__init__()
        self.stages = []
        for _ in range(depth):
            self.stages.append(Block())
""",
            line=9,
            fixed="""
import torch.nn as nn

class Block(nn.Module):
    pass

class Tower(Block):
    def __init__(self, depth):
        super().__init__()
        self.stages = nn.ModuleList()
        for _ in range(depth):
            self.stages.append(Block())
""",
        ),
        # rebound, but only to another plain container: still unregistered
        Invalid(
            """
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = [nn.Linear(4, 4)]
        self.blocks = self.blocks + [nn.Linear(4, 2)]
""",
            line=6,
            fixed="""
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4)])
        self.blocks = self.blocks + [nn.Linear(4, 2)]
""",
        ),
        # a wrapper with a transform *and* a layer still has parameters
        Invalid(
            """
import torch
import torchaudio

class Frontend(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(n_mels=80)
        self.proj = torch.nn.Linear(80, 256)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frontends = [Frontend() for _ in range(2)]
""",
            line=13,
            fixed="""
import torch
import torchaudio

class Frontend(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mel = torchaudio.transforms.MelSpectrogram(n_mels=80)
        self.proj = torch.nn.Linear(80, 256)

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.frontends = torch.nn.ModuleList([Frontend() for _ in range(2)])
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        from trainlint.edits import replace_node

        prefix = nn_prefix(model)
        for cls in model.classes:
            if not is_module_class(model, cls):
                continue
            # Most module classes store no container at all: look for candidates first,
            # and walk the whole class for other uses only when there is one.
            candidates: list[tuple[ast.Assign, str, str | None]] = []
            for node in walk_local(cls):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                # the method's own assignments in source order, as walk_local meets them
                for stmt in model.assignments_in(node):
                    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                        continue
                    target = stmt.targets[0]
                    if not (
                        isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ):
                        continue
                    kind = module_elements(model, stmt.value)
                    empty = isinstance(stmt.value, ast.List) and not stmt.value.elts
                    if (kind is not None or empty) and not rebound_to_registered(
                        model, node, stmt, target.attr
                    ):
                        candidates.append((stmt, target.attr, kind))
            if not candidates:
                continue
            uses = self._attribute_uses(model, cls)
            if uses is None:
                continue
            for stmt, attr, kind in candidates:
                if attr in uses["registered"]:
                    continue
                if kind is None:
                    if attr not in uses["appended"]:
                        continue
                    kind = "empty"
                fix = None
                if prefix is not None:
                    text = model.source.segment(stmt.value)
                    if kind == "empty":
                        new = f"{prefix}.ModuleList()"
                    elif kind == "list":
                        new = f"{prefix}.ModuleList({text})"
                    elif isinstance(stmt.value, ast.Dict) and all(
                        isinstance(k, ast.Constant) and isinstance(k.value, str)
                        for k in stmt.value.keys
                    ):
                        new = f"{prefix}.ModuleDict({text})"
                    else:
                        new = None
                    if new is not None:
                        wrapper = "ModuleDict" if "Dict" in new else "ModuleList"
                        fix = self.fix(
                            replace_node(model, stmt.value, new),
                            message=f"wrap in `{prefix}.{wrapper}`",
                        )
                yield self.report(stmt, fix=fix)

    @staticmethod
    def _attribute_uses(model: FileModel, cls: ast.ClassDef) -> dict[str, set[str]] | None:
        """Attributes registered some other way (passed to a call, add_module) or appended to."""
        registered: set[str] = set()
        appended: set[str] = set()
        for node in walk_tree(cls):  # ast.walk's order: the adds and discards interleave
            if isinstance(node, ast.Call):
                name = call_name(node)
                if name in ("add_module", "register_module", "setattr", "register_buffer"):
                    return None  # registration by hand: cannot tell which attributes
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    inner = arg.value if isinstance(arg, ast.Starred) else arg
                    for sub in walk_tree(inner):
                        if (
                            isinstance(sub, ast.Attribute)
                            and isinstance(sub.value, ast.Name)
                            and sub.value.id == "self"
                        ):
                            registered.add(sub.attr)
                func = node.func
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr in ("append", "extend", "insert")
                    and isinstance(func.value, ast.Attribute)
                    and isinstance(func.value.value, ast.Name)
                    and func.value.value.id == "self"
                ):
                    registered.discard(func.value.attr)
                    if any(holds_module_construction(model, a) for a in node.args) or any(
                        module_elements(model, a) for a in node.args
                    ):
                        appended.add(func.value.attr)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
                if module_elements(model, node.value):
                    appended.add(node.target.attr)
        # `self.x.append(...)` puts self.x among call *receivers*, not arguments
        return {"registered": registered - appended, "appended": appended}
