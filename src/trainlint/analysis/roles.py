"""Roles of names: which locals, globals and ``self.x`` attributes are optimizers,
schedulers, models, criteria, grad scalers, data loaders and samplers.

Roles come from resolved constructors (``torch.optim.AdamW(...)`` however imported),
from values returned by same-file factories (through tuple unpacking), from
``accelerator.prepare``-style pass-through calls, and from ``X.parameters()`` feeding
an optimizer (so X is a model). A name bound to things of different roles has no
role. A receiver with no binding at all falls back to its spelling
(``optimizer``, ``opt_g``, ``lr_scheduler``) only where rules ask for that.
"""

from __future__ import annotations

import ast
import re
from enum import Enum
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

from trainlint._record import Record
from trainlint.analysis.arguments import argument_at, call_sites, default_of
from trainlint.analysis.hooks import ANSWERS
from trainlint.analysis.model import call_name, dotted, walk_local, walk_tree
from trainlint.analysis.torch_table import (
    GRAD_SCALERS,
    PREPARE_METHODS,
    SAME_OBJECT_METHODS,
    SHARING_WRAPPERS,
)

if TYPE_CHECKING:
    from trainlint.analysis.model import FileModel


class Role(Enum):
    OPTIMIZER = "optimizer"
    SCHEDULER = "scheduler"
    MODEL = "model"
    CRITERION = "criterion"
    SCALER = "scaler"
    LOADER = "loader"
    SAMPLER = "sampler"


class Binding(Record, frozen=True):
    """An object's role, where it is bound: ``qualname`` the constructor, when known;
    ``call`` the construction; ``node`` the binding statement."""

    __slots__ = ("role", "qualname", "call", "node")

    def __init__(
        self, role: Role, qualname: str | None, call: ast.Call | None, node: ast.AST
    ) -> None:
        self.role = role
        self.qualname = qualname
        self.call = call
        self.node = node

    # (written out: the role passes compare and hash bindings often)
    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.role, self.qualname, self.call, self.node) == (
            other.role,  # type: ignore[attr-defined]
            other.qualname,  # type: ignore[attr-defined]
            other.call,  # type: ignore[attr-defined]
            other.node,  # type: ignore[attr-defined]
        )

    def __hash__(self) -> int:
        return hash((self.role, self.qualname, self.call, self.node))


Key = tuple[object, ...]

_MODULE_BASES = {
    "torch.nn.Module",
    "pytorch_lightning.LightningModule",
    "pytorch_lightning.core.LightningModule",
    "lightning.LightningModule",
    "lightning.pytorch.LightningModule",
    "transformers.PreTrainedModel",
}
_OPTIMIZER_BASES = {"torch.optim.Optimizer", "torch.optim.optimizer.Optimizer"}
_SCHEDULER_BASES = {
    "torch.optim.lr_scheduler.LRScheduler",
    "torch.optim.lr_scheduler._LRScheduler",
    "torch.optim.lr_scheduler.LambdaLR",
}
_ROLE_VALUES = (ast.Call, ast.Name, ast.Attribute, ast.Tuple, ast.List, ast.IfExp)
_TRAINING_LIBRARIES = (
    "torch",
    "transformers",
    "accelerate",
    "lightning",
    "pytorch_lightning",
    "timm",
    "apex",
    "bitsandbytes",
    "deepspeed",
    "torch_xla",
    "fairscale",
    "detectron2",
    "mmengine",
    "fairseq",
    "ignite",
    "composer",
    "builtins",
)
_OPT_NAME = re.compile(r"(optim|^opt$|^opt_|_opt$|^opt[A-Z0-9]|^opt[gd]$)", re.IGNORECASE)
_SCHED_NAME = re.compile(r"sched", re.IGNORECASE)


def name_role(expr: ast.AST) -> Role | None:
    """Role suggested by spelling alone (``optimizer``, ``opt_d``, ``lr_scheduler``)."""
    name = dotted(expr)
    if name is None:
        return None
    last = name.rsplit(".", 1)[-1]
    if _SCHED_NAME.search(last):
        return Role.SCHEDULER
    if _OPT_NAME.search(last) and "option" not in last.lower():
        return Role.OPTIMIZER
    if "scaler" in last.lower():
        return Role.SCALER
    return None


class Roles:
    """Role bindings of one file, computed once on first use."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self.bindings: dict[Key, list[Binding]] = {}
        self._returns: dict[int, list[list[Binding | None]]] = {}
        self._in_progress: set[int] = set()
        # targets assigned a call that has no role, and the call: those built by something
        # certainly not a training-library object are `not_torch`, asked for only by
        # spelling-based guesses (most files never ask)
        self._no_role_calls: list[tuple[Key, ast.Call]] = []
        self._looked: list[tuple[ast.AST, Binding | None]] | None = None
        self._keys: dict[int, Key | None] = {}
        #: per function: the values its `return` statements give, in walk_local order
        self._return_values: dict[int, list[ast.expr]] = {}
        # Bindings flow through names, attributes and factory returns in any order:
        # iterate to a fixpoint (a few passes suffice for real files).
        self._next: dict[Key, list[Binding]] = {}
        previous: object = None
        passes = 4
        for n in range(passes):
            self._next = {}
            self._returns = {}
            # A pass reads the previous pass's bindings only through `lookup`, and is
            # otherwise a pure function of the file: when every lookup it made would
            # answer the same with the bindings it built, the next pass would repeat it
            # exactly, so it is not run (for most files: the second of two passes).
            looked: list[tuple[ast.AST, Binding | None]] = []
            self._looked = looked
            for node in model.assignments:
                self._bind_assignment(node)
            for w in model.withs:
                for item in w.items:
                    if item.optional_vars is not None:
                        self._bind_target(item.optional_vars, item.context_expr, w)
            self._looked = None
            before = self.bindings
            self.bindings = self._next
            self._bind_parameter_owners()
            if n + 1 == passes or all(
                self._same_answer(e, before) or self.lookup(e) == found for e, found in looked
            ):
                break
            summary = {k: tuple(b.role for b in v) for k, v in self.bindings.items()}
            if summary == previous:
                break
            previous = summary

    # -- keys ------------------------------------------------------------------------
    def key(self, expr: ast.AST) -> Key | None:
        # A key depends on the file alone: memoized for the file's own nodes (each fixpoint
        # pass asks again for every target and value), not for nodes an analysis built.
        k = id(expr)
        try:
            return self._keys[k]
        except KeyError:
            pass
        found = self._key(expr)
        if self.model.indexed(expr):
            self._keys[k] = found
        return found

    def _key(self, expr: ast.AST) -> Key | None:
        m = self.model
        if isinstance(expr, ast.Name):
            for scope in m.scope_chain(expr):
                if isinstance(scope, ast.ClassDef):
                    continue
                b = m.imports.scopes.get(id(scope))
                if scope is m.tree or (b is not None and expr.id in b.others):
                    if b is not None and expr.id in b.globals:
                        return ("name", id(m.tree), expr.id)
                    return ("name", id(scope), expr.id)
            return ("name", id(m.tree), expr.id)
        if isinstance(expr, ast.Attribute):
            base = expr.value
            if isinstance(base, ast.Name) and base.id in ("self", "cls"):
                cls = self.model.enclosing_class(expr)
                if cls is not None:
                    return ("attr", id(cls), expr.attr)
            name = dotted(expr)
            if name is not None:
                return ("dotted", name)
        return None

    def _same_answer(self, expr: ast.AST, before: dict[Key, list[Binding]]) -> bool:
        """Whether ``lookup(expr)`` answers now as it did with the ``before`` bindings
        without asking it again: its key is in neither (then the answer never read them:
        None, or a foreign binding, which does not depend on them), and it is not an
        attribute that inherited lookups would search for in base classes."""
        key = self.key(expr)
        if key is None:
            return True
        return key[0] != "attr" and key not in before and key not in self.bindings

    # -- queries ---------------------------------------------------------------------
    def lookup(self, expr: ast.AST) -> Binding | None:
        """The single consistent role binding of ``expr``, or None."""
        found = self._lookup(expr)
        if self._looked is not None:
            self._looked.append((expr, found))
        return found

    def _lookup(self, expr: ast.AST) -> Binding | None:
        key = self.key(expr)
        found = self.bindings.get(key) if key is not None else None
        if not found and isinstance(expr, ast.Attribute) and key and key[0] == "attr":
            # inherited attribute: look in same-file base classes
            cls = self.model.enclosing_class(expr)
            seen: set[int] = set()
            while cls is not None and not found and id(cls) not in seen:
                seen.add(id(cls))
                cls = self.model.local_base(cls)
                if cls is not None:
                    found = self.bindings.get(("attr", id(cls), expr.attr))
        if not found:
            # never assigned in this file: a parameter (its annotation or call sites), or
            # `ctx.training.scheduler`, a chain of project objects built elsewhere
            if (
                key is not None
                and key not in self.bindings
                and (
                    isinstance(expr, ast.Name)
                    or (
                        isinstance(expr, ast.Attribute)
                        and key[0] == "dotted"
                        and self.model.project
                    )
                )
            ):
                foreign = ANSWERS.foreign_binding(self.model, expr)
                if foreign is None and isinstance(expr, ast.Name):
                    return self._default_criterion(expr)
                return foreign
            return None
        roles = {b.role for b in found}
        if len(roles) != 1:
            return None
        return found[-1]

    def _default_criterion(self, name: ast.Name) -> Binding | None:
        """A parameter never assigned in its function, whose default builds a loss module
        (``def __init__(self, loss=nn.CrossEntropyLoss())``), about which the project index
        knows nothing from the call sites: the default's binding. A caller that passes
        a loss module the index can name gives that one instead. Only for loss modules,
        whose default is the one a class is written for."""
        fn = self.model.function_of(name)
        if fn is None or isinstance(fn, ast.Lambda):
            return None
        default = default_of(fn, name.id)
        if not isinstance(default, ast.Call):
            return None
        found = self.classify(default)
        if len(found) != 1 or found[0] is None or found[0].role is not Role.CRITERION:
            return None
        for arg in self._passed_here(fn, name.id):
            other = self._single(arg)
            if other is None or other.qualname != found[0].qualname:
                return None  # a call in this file passes another (or an unknown) loss
        return found[0]

    def _passed_here(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef, param: str
    ) -> list[ast.expr]:
        """What the calls of ``fn`` in this file pass for ``param`` (a class's ``__init__``:
        the calls of the class), where they pass it."""
        m = self.model
        out: list[ast.expr] = []
        for call in call_sites(m, fn, instances=False, constructions=True):
            # `**options` may hold it: what it passes is not known (an unknown value)
            arg = next((k.value for k in call.keywords if k.arg in (param, None)), None)
            if arg is None:
                arg = argument_at(m, call, fn, param)
            if arg is not None:
                out.append(arg)
        return out

    def role(self, expr: ast.AST, *, by_name: bool = False) -> Role | None:
        b = self.lookup(expr)
        if b is not None:
            return b.role
        if expr is not None and isinstance(expr, ast.Call):
            classified = self.classify(expr)
            if len(classified) == 1 and classified[0] is not None:
                return classified[0].role
        if by_name and self.model.imports_training_library:
            key = self.key(expr) if expr is not None else None
            if key is not None and key in self._not_torch:
                return None  # built by a shadowed `torch.optim...`: spelling is no evidence
            return name_role(expr)
        return None

    def all_of(self, role: Role) -> list[tuple[Key, Binding]]:
        return [(k, b) for k, bs in self.bindings.items() for b in bs if b.role is role]

    # -- binding -------------------------------------------------------------------------
    def _add(self, target: ast.AST, binding: Binding | None, stmt: ast.AST) -> None:
        key = self.key(target)
        if key is None:
            return
        lst = self._next.setdefault(key, [])
        if binding is not None:
            lst.append(binding)

    def _bind_assignment(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                self._bind_target(t, node.value, node)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self._bind_target(node.target, node.value, node)

    def _bind_target(self, target: ast.AST, value: ast.AST, stmt: ast.AST) -> None:
        if isinstance(value, ast.Subscript) and self.model.project:
            # `self.scheduler = kwargs["scheduler"]`: the keyword's facts at the call sites
            b = ANSWERS.foreign_binding(self.model, value)
            if b is not None and isinstance(target, (ast.Name, ast.Attribute)):
                self._add(target, b, stmt)
            return
        if not isinstance(value, _ROLE_VALUES):
            return  # constants, arithmetic, comprehensions: never an optimizer or a model
        if isinstance(target, (ast.Tuple, ast.List)):
            values = self.classify_many(value, len(target.elts))
            for t, b in zip(target.elts, values, strict=False):
                if isinstance(t, (ast.Name, ast.Attribute)):
                    self._add(t, b, stmt)
            return
        if isinstance(target, (ast.Name, ast.Attribute)):
            found = self.classify(value)
            self._add(target, found[0] if len(found) == 1 else None, stmt)
            if found == [None] and isinstance(value, ast.Call):
                key = self.key(target)
                if key is not None:
                    self._no_role_calls.append((key, value))

    @cached_property
    def _not_torch(self) -> set[Key]:
        """Targets some assignment gives a call built by something certainly not a
        training-library object (see ``_foreign``): their spelling is no evidence."""
        return {key for key, call in self._no_role_calls if self._foreign(call)}

    def _foreign(self, call: ast.Call) -> bool:
        """Built by something that is certainly not a training-library object: a shadowed
        `torch.optim...` spelling, or another library's class (`StandardScaler()`)."""
        text = dotted(call.func) or ""
        qual = self.model.qualname(call.func)
        if qual is None:
            return text.split(".")[0] in ("torch", "optim", "nn")
        return not qual.startswith(_TRAINING_LIBRARIES) and not qual.startswith(".")

    def classify_many(self, value: ast.AST, n: int) -> list[Binding | None]:
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == n:
            return [self._single(v) for v in value.elts]
        found = self.classify(value)
        if len(found) == n:
            return found
        return [None] * n

    def _single(self, value: ast.AST) -> Binding | None:
        found = self.classify(value)
        return found[0] if len(found) == 1 else None

    def classify(self, value: ast.AST) -> list[Binding | None]:
        """Roles of the object(s) an expression evaluates to (a list for tuples)."""
        m = self.model
        if isinstance(value, (ast.Name, ast.Attribute)):
            b = self.lookup(value)
            return [b] if b is not None else [None]
        if isinstance(value, (ast.Tuple, ast.List)):
            return [self._single(v) for v in value.elts]
        if isinstance(value, ast.IfExp):
            return self._optional(value)
        if not isinstance(value, ast.Call):
            return [None]
        call = value
        qual = m.qualname(call.func)
        stmt: ast.AST = call
        if qual is not None:
            role = constructor_role(qual)
            if role is not None:
                return [Binding(role, qual, call, stmt)]
            if qual in SHARING_WRAPPERS and call.args:
                return [self._single(call.args[0])]
        name = call_name(call)
        func = call.func
        if isinstance(func, ast.Attribute):
            if name in SAME_OBJECT_METHODS:
                inner = self._single(func.value)
                # a loss module moves like a model: `nn.CrossEntropyLoss().cuda()` is it
                if inner is not None and inner.role in (Role.MODEL, Role.CRITERION):
                    return [inner]
            if name in PREPARE_METHODS and call.args:
                outs = [self._single(a) for a in call.args]
                return outs
            if (
                name == "optimizers"
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                return [Binding(Role.OPTIMIZER, None, call, stmt)]
            if name == "from_pretrained":
                return [Binding(Role.MODEL, qual, call, stmt)]
        local_cls = self._local_class(call.func)
        if local_cls is not None:
            role = class_role(m, local_cls)
            return [Binding(role, local_cls.name, call, stmt) if role else None]
        target = m.resolve_call(call)
        if target is not None:
            return self._returned(target)
        if (
            m.project
            and qual is None
            and name in ("get", "pop")
            and isinstance(func, ast.Attribute)
        ):
            # `kwargs.get("scheduler")`: the keyword's facts at the call sites
            return [ANSWERS.foreign_binding(m, call)]
        if qual is not None and m.project is not None:
            # a factory or class of another project file (the project index's view)
            return [ANSWERS.foreign_binding(m, call)]
        return [None]

    def _optional(self, value: ast.IfExp) -> list[Binding | None]:
        """``build_scheduler(opt, cfg) if cfg.use_scheduler else None``: one of an object
        and None. None is no object at all (every use of it is guarded, or fails loudly),
        so the value is the object's. Two objects (``A() if c else B()``) are not told
        apart: which one runs is the condition's."""
        branches = [b for b in (value.body, value.orelse) if not _is_none(b)]
        if len(branches) != 1:
            return [None]
        found = self.classify(branches[0])
        return found if len(found) == 1 else [None]

    def _local_class(self, func: ast.AST) -> ast.ClassDef | None:
        if isinstance(func, ast.Name):
            cls = self.model.class_named(func.id)
            if cls is not None and self.model.qualname(func) is None:
                return cls
        return None

    def _returned(self, fn: ast.AST) -> list[Binding | None]:
        if id(fn) in self._returns:
            out = self._returns[id(fn)]
            return out[0] if len(out) == 1 else [None]
        if id(fn) in self._in_progress:
            return [None]
        self._in_progress.add(id(fn))
        values = self._return_values.get(id(fn))
        if values is None:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                returns = self.model.returns_in(fn)  # walk_local's, from the index
            else:
                returns = [node for node in walk_local(fn) if isinstance(node, ast.Return)]
            values = self._return_values[id(fn)] = [
                node.value for node in returns if node.value is not None
            ]
        results = [self.classify(value) for value in values]
        self._in_progress.discard(id(fn))
        # Only a single consistent return shape counts.
        shapes = {tuple(b.role if b else None for b in r) for r in results}
        self._returns[id(fn)] = results if len(shapes) == 1 else []
        if len(shapes) != 1:
            return [None]
        return results[-1]

    def _bind_parameter_owners(self) -> None:
        """``SGD(model.parameters())``: whatever feeds an optimizer is a model."""
        for _, b in self.all_of(Role.OPTIMIZER):
            if b.call is None:
                continue
            for owner in parameter_owners(b.call):
                key = self.key(owner)
                if key is None:
                    continue
                existing = self.bindings.get(key)
                if not existing:
                    self.bindings[key] = [Binding(Role.MODEL, None, None, b.node)]


@lru_cache(maxsize=4096)
def _is_none(expr: ast.AST) -> bool:
    return isinstance(expr, ast.Constant) and expr.value is None


#: The library's names before it was `transformers`: its schedules were classes
#: (`WarmupLinearSchedule(optimizer, warmup_steps, t_total)`, LambdaLR subclasses).
LEGACY_TRANSFORMERS = ("pytorch_transformers.", "pytorch_pretrained_bert.", "transformers.")
LEGACY_SCHEDULE = re.compile(r"^Warmup\w*Schedule$")


def constructor_role(qual: str) -> Role | None:
    """The role of what calling ``qual`` builds, by its name alone (the same in every
    file: remembered for the run)."""
    parts = qual.split(".")
    last = parts[-1]
    if qual.startswith("torch.optim.lr_scheduler.") and last[:1].isupper():
        return Role.SCHEDULER
    if qual.startswith("torch.optim.") and last[:1].isupper() and last != "Optimizer":
        return Role.OPTIMIZER
    if qual.startswith("transformers") and re.match(r"get_\w*schedule", last):
        return Role.SCHEDULER
    if qual.startswith(LEGACY_TRANSFORMERS) and LEGACY_SCHEDULE.match(last):
        return Role.SCHEDULER
    if qual.startswith(("transformers", *LEGACY_TRANSFORMERS)) and last in ("AdamW", "Adafactor"):
        return Role.OPTIMIZER
    if re.search(r"(^|\.)(optim|optimizers)\.[A-Z]", qual) and "lr_scheduler" not in qual:
        return Role.OPTIMIZER
    if qual.startswith("timm.optim.create_optimizer"):
        return Role.OPTIMIZER
    if qual in GRAD_SCALERS:
        return Role.SCALER
    if qual == "torch.utils.data.DataLoader":
        return Role.LOADER
    if qual == "torch.utils.data.DistributedSampler":
        return Role.SAMPLER
    if qual.startswith("torch.nn.") and len(parts) == 3 and last[:1].isupper():
        if last.endswith("Loss"):
            return Role.CRITERION
        if last not in ("Parameter", "ParameterList", "ParameterDict", "Module"):
            return Role.MODEL
    if qual.startswith("torchvision.models.") and last[:1].islower():
        return Role.MODEL
    if qual in ("timm.create_model",):
        return Role.MODEL
    return None


def parameter_owners(call: ast.Call) -> list[ast.expr]:
    """``X`` for each ``X.parameters()``/``X.named_parameters()`` inside the call's args."""
    out: list[ast.expr] = []
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        for sub in walk_tree(arg):
            if (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr in ("parameters", "named_parameters")
            ):
                out.append(sub.func.value)
    return out


#: The public classes of ``torch.nn`` that are not modules.
_NOT_MODULES = frozenset(("Parameter", "UninitializedParameter", "UninitializedBuffer", "Buffer"))


def _is_torch_layer(qualname: str | None) -> bool:
    """``torch.nn.Conv2d``, ``torch.nn.Sequential``: a layer class of ``torch.nn`` (every
    public class there is a module but parameters and buffers), so a subclass of one, a
    spectral-norm conv or a custom ``Linear``, is a module too."""
    if qualname is None or not qualname.startswith("torch.nn."):
        return False
    parts = qualname.split(".")
    return len(parts) == 3 and parts[2][:1].isupper() and parts[2] not in _NOT_MODULES


def class_role(model: FileModel, cls: ast.ClassDef) -> Role | None:
    """The role of the objects a same-file class builds, from its bases alone (a torch
    module, optimizer or scheduler base, or a same-file class that has one): no role
    bindings needed, so asking it does not build :class:`Roles`."""
    known: dict[int, Role | None] = model.memo(class_role, lambda _: {})
    cached = known.get(id(cls), ...)
    if cached is not ...:
        return cached  # type: ignore[return-value]
    known[id(cls)] = None  # cycle guard
    role: Role | None = None
    for base in cls.bases:
        q = model.qualname(base)
        if q in _MODULE_BASES or _is_torch_layer(q):
            role = Role.MODEL
        elif q in _OPTIMIZER_BASES:
            role = Role.OPTIMIZER
        elif q in _SCHEDULER_BASES or (q or "").startswith("torch.optim.lr_scheduler."):
            role = Role.SCHEDULER
        elif isinstance(base, ast.Name):
            local = model.class_named(base.id)
            if local is not None:
                role = class_role(model, local)
        if role is not None:
            break
    known[id(cls)] = role
    return role


def is_module_class(model: FileModel, cls: ast.ClassDef) -> bool:
    """``cls`` is an ``nn.Module`` subclass (directly or through same-file classes)."""
    return class_role(model, cls) is Role.MODEL


def nn_prefix(model: FileModel) -> str | None:
    """How this file can spell ``torch.nn``: ``nn`` or ``torch.nn`` (module scope)."""
    b = model.imports.scopes.get(id(model.tree))
    if b is None:
        return None
    for local, q in b.imports.items():
        if q == "torch.nn" and local not in b.others:
            return local
    for local, q in b.imports.items():
        if q == "torch" and local not in b.others:
            return f"{local}.nn"
    return None


def modules_by_protocol(model: FileModel) -> set[str]:
    """Receivers (dotted: ``self.model``) that the file both switches between modes
    (``eval()``/``train()``) and clears the gradients of (``zero_grad()``): an
    ``nn.Module`` by its uses, in a file that may never import torch itself (the model
    arrives as a constructor parameter, built and wrapped elsewhere)."""
    moded: set[str] = set()
    for name in ("eval", "train"):
        for call in model.calls.get(name, ()):
            if isinstance(call.func, ast.Attribute) and not call.args:
                recv = dotted(call.func.value)
                if recv is not None:
                    moded.add(recv)
    cleared = {
        recv
        for call in model.calls.get("zero_grad", ())
        if isinstance(call.func, ast.Attribute)
        and (recv := dotted(call.func.value)) is not None
    }
    return moded & cleared


# The answers this module gives to lower layers (see analysis.hooks).
ANSWERS.roles = Roles
