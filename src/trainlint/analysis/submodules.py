"""What `nn.Module`s are built from and what they keep. Expressions that build modules:
one module construction, or a plain ``list``, ``tuple`` or ``dict`` of freshly built ones
(parameter-free data transforms do not count: nothing of theirs can be missing from
`.parameters()` or `state_dict()`). And what a module's forward pass stores on itself,
with the graph that pass builds."""

from __future__ import annotations

import ast

from trainlint.analysis.flow import (
    CUT_METHODS,
    NO_GRAD_RESULTS,
    Taint,
    defined_from,
    is_parameter,
)
from trainlint.analysis.model import FileModel, FunctionNode, call_name, dotted, walk_local
from trainlint.analysis.roles import Role, is_module_class


def is_module_construction(model: FileModel, node: ast.AST) -> bool:
    """``node`` is a call that builds one module (not a parameter-free transform)."""
    if not isinstance(node, ast.Call):
        return False
    found = model.roles.classify(node)
    return (
        len(found) == 1
        and found[0] is not None
        and found[0].role is Role.MODEL
        and (found[0].call is node)
        and not _is_transform(model, node)
    )


_TRANSFORM_PREFIXES = ("torchaudio.transforms.", "torchvision.transforms.")


def _is_transform(model: FileModel, call: ast.Call, depth: int = 0) -> bool:
    """A parameter-free data transform: a torchaudio/torchvision transform, or a
    same-file module whose only submodules are such transforms. Nothing of it can be
    missing from `.parameters()` or `state_dict()`."""
    if (model.qualname(call.func) or "").startswith(_TRANSFORM_PREFIXES):
        return True
    if depth > 0 or not isinstance(call.func, ast.Name) or model.qualname(call.func):
        return False
    cls = model.class_named(call.func.id)
    if cls is None or model.local_base(cls) is not None:
        return False
    built = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and call_name(node) in (
            "Parameter",
            "register_parameter",
            "register_buffer",
            "add_module",
        ):
            return False
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                for t in node.targets
            )
        ):
            built.append(node.value)
    return bool(built) and all(_is_transform(model, b, depth + 1) for b in built)


def holds_module_construction(model: FileModel, node: ast.AST) -> bool:
    """``node`` builds one module, or is a local name whose every assignment before it
    does (``block = nn.Conv1d(...)`` then ``self.blocks.append(block)``): what a list
    collects is usually built a line earlier, under a name."""
    if is_module_construction(model, node):
        return True
    if not isinstance(node, ast.Name) or model.function_of(node) is None:
        return False
    found = model.flow.definitions_before(node.id, node)
    return bool(found) and all(
        isinstance(stmt, ast.Assign) and is_module_construction(model, value)
        for stmt, value in found
    )


def module_elements(model: FileModel, value: ast.AST) -> str | None:
    """ "list" or "dict" when ``value`` builds a plain container of freshly built modules."""
    if (
        isinstance(value, ast.Call)
        and call_name(value) in ("list", "tuple", "dict")
        and (model.qualname(value.func) or "").startswith("builtins.")
        and len(value.args) == 1
        and not value.keywords
    ):
        inner = module_elements(model, value.args[0])
        if inner is None and isinstance(value.args[0], ast.GeneratorExp):
            return "list" if is_module_construction(model, value.args[0].elt) else None
        return inner
    if isinstance(value, (ast.List, ast.Tuple)):
        if value.elts and all(is_module_construction(model, e) for e in value.elts):
            return "list"
        return None
    if isinstance(value, ast.ListComp):
        return "list" if is_module_construction(model, value.elt) else None
    if isinstance(value, ast.Dict):
        if (
            value.values
            and all(k is not None for k in value.keys)
            and all(is_module_construction(model, v) for v in value.values)
        ):
            return "dict"
        return None
    if isinstance(value, ast.DictComp):
        return "dict" if is_module_construction(model, value.value) else None
    return None


def is_plain_container(model: FileModel, value: ast.AST) -> bool:
    """``value`` builds a plain Python container: a display, a comprehension, or a call
    of builtin ``list``/``tuple``/``dict``. Modules inside it are not registered."""
    if isinstance(value, (ast.List, ast.Tuple, ast.Dict, ast.ListComp, ast.DictComp)):
        return True
    return (
        isinstance(value, ast.Call)
        and call_name(value) in ("list", "tuple", "dict")
        and (model.qualname(value.func) or "").startswith("builtins.")
    )


def rebound_to_registered(model: FileModel, method: ast.AST, stmt: ast.stmt, attr: str) -> bool:
    """The plain container that ``stmt`` stores in ``self.<attr>`` is only a builder:
    a later assignment of the same method rebinds ``self.<attr>`` to something that is
    not a plain container (``nn.ModuleList(self.<attr>)``, ``nn.Sequential(*...)``), so
    the modules end up registered after all."""
    seen = False
    for other in model.assignments_in(method):
        if other is stmt:
            seen = True
            continue
        if not seen or not isinstance(other, (ast.Assign, ast.AnnAssign)):
            continue
        targets = other.targets if isinstance(other, ast.Assign) else [other.target]
        if other.value is None:
            continue
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == attr
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                if isinstance(other.value, ast.BinOp) or is_plain_container(model, other.value):
                    break  # still a plain container (`self.x = self.x + [...]`)
                return True  # a wrapper call, or a value we cannot see: not a plain list
    return False


def _self_rooted(target: ast.AST) -> bool:
    """``self.x``, ``self.x.y``, ``self.x[i]``, ``self.x[i][:]``: a store that lands on the
    module (or on a buffer it holds) rather than on a local."""
    seen_attribute = False
    while isinstance(target, (ast.Attribute, ast.Subscript)):
        seen_attribute = seen_attribute or isinstance(target, ast.Attribute)
        target = target.value
    return seen_attribute and isinstance(target, ast.Name) and target.id == "self"


def _reached(model: FileModel, forward: FunctionNode) -> list[FunctionNode]:
    cls = model.class_of(forward)
    reached = [forward]
    if cls is None:
        return reached
    for node in walk_local(forward):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and (method := model.method_of(cls, node.func.attr)) is not None
            and method not in reached
        ):
            reached.append(method)
    return reached


def reached_from_forward(model: FileModel, forward: FunctionNode) -> list[FunctionNode]:
    """``forward`` and the methods it calls on ``self``, found through same-file bases
    and mixins (a spectral-norm mixin's ``W_()`` runs inside the conv's forward)."""
    by_forward: dict[int, list[FunctionNode]] = model.memo(reached_from_forward, lambda _: {})
    found = by_forward.get(id(forward))
    if found is None:
        found = by_forward[id(forward)] = _reached(model, forward)
    return found


def _forward_stores(model: FileModel) -> list[tuple[ast.Assign, FunctionNode]]:
    out: list[tuple[ast.Assign, FunctionNode]] = []
    seen: set[int] = set()
    for cls in model.classes:
        forward = model.methods(cls).get("forward")
        if forward is None or not is_module_class(model, cls):
            continue
        for fn in reached_from_forward(model, forward):
            for stmt in model.assignments_in(fn):
                if (
                    isinstance(stmt, ast.Assign)
                    and len(stmt.targets) == 1
                    and _self_rooted(stmt.targets[0])
                    and id(stmt) not in seen
                ):
                    seen.add(id(stmt))
                    out.append((stmt, forward))
    return out


def forward_stores(model: FileModel) -> list[tuple[ast.Assign, FunctionNode]]:
    """Assignments that store on ``self`` while an ``nn.Module`` runs its forward pass
    (``self.attn = a``, ``self.sv[i][:] = s``): in ``forward`` itself or in a method it
    calls on ``self``. Each with the forward it runs in."""
    return model.memo(_forward_stores, _forward_stores)


def _read_names(expr: ast.AST) -> list[ast.expr]:
    """The names and dotted attributes an expression reads (an index carries no graph)."""
    found: list[ast.expr] = []
    stack = [expr]
    while stack:
        sub = stack.pop()
        if isinstance(sub, ast.Attribute) and sub.attr == "data":
            continue  # `.data` reads the tensor without its history
        if isinstance(sub, (ast.Name, ast.Attribute)) and dotted(sub) is not None:
            found.append(sub)
            continue
        if isinstance(sub, ast.Subscript):
            stack.append(sub.value)
            continue
        if isinstance(sub, ast.Call) and (
            (isinstance(sub.func, ast.Attribute) and sub.func.attr in _NO_GRAPH_METHODS)
            or call_name(sub) in NO_GRAD_RESULTS
            or (isinstance(sub.func, ast.Name) and sub.func.id in ("len", "int", "float"))
        ):
            continue  # `.detach()`, `.size(2)`, `torch.histc(i)`: no graph through these
        stack.extend(ast.iter_child_nodes(sub))
    return found


#: A module's own tensors that take part in its graph (nn.Linear/Conv and the like).
_OWN_PARAMETERS = frozenset(("self.weight", "self.bias"))
#: Tensor methods whose result carries no graph: cuts and sizes.
_NO_GRAPH_METHODS = CUT_METHODS | {"size", "dim", "numel", "nelement", "get_device"}
#: Attributes of a tensor that carry no graph.
_METADATA = frozenset(("shape", "dtype", "device", "ndim", "requires_grad", "is_leaf"))


def builds_on_forward_graph(model: FileModel, value: ast.AST, forward: FunctionNode) -> bool:
    """Is ``value``, computed while ``forward`` runs, made of the graph that pass builds:
    of the forward's tensor inputs, of the module's own ``weight``/``bias``, or of a value
    the flow knows carries autograd history, through local definitions with no cut
    (``.detach()``, ``.item()``) on the way? Unknown sources answer no."""
    # the first input is the batch the pass runs on; the others are often sizes, masks,
    # flags or a graph structure, and a stored input itself is a reference, not a result
    inputs = {a.arg for a in (*forward.args.posonlyargs, *forward.args.args)[1:2]}
    if isinstance(value, ast.Name) and value.id in inputs:
        return False
    frontier: list[ast.AST] = [value]
    budget = 60
    while frontier and budget > 0:
        budget -= 1
        expr = frontier.pop()
        taint = model.flow.value(expr).taint
        if taint is Taint.GRAD:
            return True
        if taint is not Taint.UNKNOWN:
            continue  # a cut, or data: no graph through this branch
        for read in _read_names(expr):
            parts = (dotted(read) or "").split(".")
            if ".".join(parts[:2]) in _OWN_PARAMETERS and parts[-1] not in _METADATA:
                return True
            if parts[0] in ("", "self") or parts[-1] in _METADATA:
                continue
            name = parts[0]
            found = model.flow.definition(name, read)
            if found is None:
                continue
            stmt, assigned = found
            if is_parameter(assigned):
                if stmt is forward and name in inputs:
                    return True
                continue
            origin = defined_from(assigned)
            frontier.append(origin if origin is not None else assigned)
    return False


def eval_only(model: FileModel, stmt: ast.stmt) -> bool:
    """``stmt`` runs only in eval mode: under ``if not self.training:`` or in the ``else``
    of ``if self.training:``, where no backward will follow."""
    child: ast.AST = stmt
    for parent in model.ancestors(stmt):
        if isinstance(parent, ast.If):
            test = parent.test
            negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            inner = test.operand if isinstance(test, ast.UnaryOp) else test
            if dotted(inner) == "self.training":
                in_body = any(child is s for s in parent.body)
                if in_body == negated:
                    return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        child = parent
    return False


def read_elsewhere(
    model: FileModel, stmt: ast.stmt, attribute: str, forward: FunctionNode | None = None
) -> bool:
    """Is ``attribute`` (``self.features``) read outside ``stmt``'s own target, in the
    function holding ``stmt`` or (given ``forward``) in any method that forward pass
    runs: a value cached to be used again in the same pass, or state carried from one
    call to the next (a key/value cache extended each call, a captured graph's output
    that a replay returns)."""
    fn = model.function_of(stmt)
    if fn is None:
        return False
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    own = {id(n) for t in targets for n in ast.walk(t)}
    scopes = [fn, *(reached_from_forward(model, forward) if forward is not None else ())]
    return any(
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and id(node) not in own
        and dotted(node) == attribute
        for scope in scopes
        for node in walk_local(scope)
    )


def _written_into(model: FileModel, node: ast.Attribute) -> bool:
    """``node`` only names the object an assignment writes into (``self.sv`` in
    ``self.sv[i][:] = s``): loaded, but its value is not read."""
    child: ast.AST = node
    parent = model.parent_of(node)
    while isinstance(parent, (ast.Subscript, ast.Attribute)) and parent.value is child:
        child, parent = parent, model.parent_of(parent)
    return isinstance(parent, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and (
        any(t is child for t in parent.targets)
        if isinstance(parent, ast.Assign)
        else parent.target is child
    )


def attribute_read_in_file(model: FileModel, attribute: str) -> bool:
    """Is an attribute of this name read anywhere in the file, on any object
    (``self.attn``, ``block.attn``, ``getattr(m, "attn")``), other than to write into it?
    A store whose attribute nothing reads is dead: whatever it costs, nobody uses it."""
    for node in model.attributes.get(attribute, ()):
        if isinstance(node.ctx, ast.Load) and not _written_into(model, node):
            return True
    return any(
        len(call.args) >= 2
        and isinstance(call.args[1], ast.Constant)
        and call.args[1].value == attribute
        for call in model.calls.get("getattr", ())
    )


def _declared_in_init(model: FileModel, cls: ast.ClassDef, attribute: str) -> bool:
    """``cls.__init__`` sets ``self.<attribute>`` (``self.last_attn = None``): the class
    declares it as state of its own, for readers this file may not hold."""
    init = model.methods(cls).get("__init__")
    return init is not None and any(
        isinstance(stmt, (ast.Assign, ast.AnnAssign))
        and any(
            dotted(t) == f"self.{attribute}"
            for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
        )
        for stmt in model.assignments_in(init)
    )


def dead_store(model: FileModel, stmt: ast.Assign) -> bool:
    """Is ``stmt`` a rebinding ``self.X = v`` that nothing uses: no read of an attribute
    named ``X`` anywhere in the file, and ``X`` not declared in the class's ``__init__``?
    A write into an object (``self.buf[:] = v``) is never dead: it reaches whatever else
    holds that object (a registered buffer, ``state_dict()``)."""
    target = stmt.targets[0] if len(stmt.targets) == 1 else None
    if not (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id == "self"
    ):
        return False
    cls = model.enclosing_class(stmt)
    if cls is None or _declared_in_init(model, cls, target.attr):
        return False
    return not attribute_read_in_file(model, target.attr)
