"""Data loaders: which names hold the object a ``DataLoader(...)`` call builds, whether a
training loop iterates it (directly, or after it was passed to a same-file function as
an argument), which `DataLoader` a loop iterates, what dataset it reads, and which of
the loop's batch tensors it copies to a device. Also whether a loop goes over data at
all, whatever iterable holds it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator

from trainlint.analysis.arguments import (
    arguments_for,
    default_of,
    parameter_for,
    parameter_names,
)
from trainlint.analysis.data_parallel import HANDED_OVER
from trainlint.analysis.devices import device_copy
from trainlint.analysis.dominance import dominates
from trainlint.analysis.model import FileModel, call_name, is_true, keyword
from trainlint.analysis.objects import Obj, objects
from trainlint.analysis.roles import Binding, Key, Role
from trainlint.analysis.torch_table import DATA_LOADER_SUBCLASSES

DATA_LOADER = "torch.utils.data.DataLoader"


def loader_constructions(model: FileModel) -> list[ast.Call]:
    """Every construction of a `DataLoader` or of another library's subclass of it
    (PyG's `NeighborLoader`, torchdata's `StatefulDataLoader`), in source order."""
    return model.calls_to(DATA_LOADER, *DATA_LOADER_SUBCLASSES)


def is_plain_loader(model: FileModel, call: ast.Call) -> bool:
    """Is ``call`` torch's own `DataLoader`, whose positional parameters are known
    (``dataset, batch_size, shuffle, sampler, ...``)?"""
    return model.qualname(call.func) == DATA_LOADER



def bound_keys(model: FileModel, call: ast.Call) -> set[Key]:
    """Role keys of the names bound to the object ``call`` builds, also through
    ``x = Call(...) if cond else other`` (the object query's answer)."""
    return objects(model).keys(call)


def reaching_keys(model: FileModel, call: ast.Call, rounds: int = 4) -> set[Key]:
    """Role keys of every name the object ``call`` builds comes to be bound to in this
    file: its own names, then, hop by hop, the caller's name for a same-file function's
    return of it (``train, test = get_loaders()``, by tuple position), the parameter of a
    same-file function or class it is passed to (``Trainer(net, train)`` reaches
    ``__init__``'s ``train_loader``), and the ``self`` attribute or name it is stored
    under. What leaves the file, or is built into something else, is not followed."""
    keys = set(bound_keys(model, call)) | _hop(model, call)  # `{"train": DataLoader(...)}`
    todo = list(keys)
    for _ in range(rounds):
        found: set[Key] = set()
        for key in todo:
            # ("item", base, "train"): the entry "train" of the dict bound to `base`
            item = key[2] if key[0] == "item" else None
            base: Key = key[1] if item is not None else key  # type: ignore[assignment]
            for read in objects(model).reads(call, base):
                if model.roles.key(read) != base:
                    continue
                if item is None:
                    found |= _hop(model, read)
                elif (sub := model.parent_of(read)) is not None and _entry(sub, read) == item:
                    found |= _hop(model, sub)
                else:  # the whole dict handed on: its entry goes with it
                    found |= {("item", k, item) for k in _hop(model, read) if k[0] != "item"}
        todo = [k for k in found if k not in keys]
        if not todo:
            break
        keys |= found
    return keys


def _hop(model: FileModel, read: ast.AST) -> set[Key]:
    """The keys one read of a value hands it to (see :func:`reaching_keys`)."""
    parent = model.parent_of(read)
    position = None
    if isinstance(parent, ast.Tuple) and isinstance(model.parent_of(parent), ast.Return):
        position, parent = parent.elts.index(read), model.parent_of(parent)  # type: ignore[arg-type]
    if isinstance(parent, ast.Return):
        fn = model.function_of(read)
        out: set[Key] = set()
        for site in model.call_sites.get(id(fn), ()) if fn is not None else ():
            out |= _assigned(model, site, position)
        return out
    if isinstance(parent, ast.Assign) and parent.value is read:
        return _assigned(model, read, None)
    if isinstance(parent, ast.Dict) and read in parent.values:
        key = parent.keys[parent.values.index(read)]  # type: ignore[arg-type]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            # wherever the dict itself goes (a name, a parameter), with this entry in it
            return {("item", k, key.value) for k in _hop(model, parent) if k[0] != "item"}
    if isinstance(parent, ast.keyword):  # `Trainer(data_loader=loaders)`
        parent = model.parent_of(parent)
    if isinstance(parent, ast.Call) and read is not parent.func:
        return _parameter(model, parent, read)
    return set()


def _entry(node: ast.AST | None, base: ast.AST) -> str | None:
    """``"train"`` for ``base["train"]``."""
    if isinstance(node, ast.Subscript) and node.value is base:
        index = node.slice
        if isinstance(index, ast.Constant) and isinstance(index.value, str):
            return index.value
    return None


def _assigned(model: FileModel, value: ast.AST, position: int | None) -> set[Key]:
    """Keys of the plain names ``value`` is assigned to (at ``position`` of a tuple target)."""
    stmt = model.parent_of(value)
    if not isinstance(stmt, ast.Assign) or stmt.value is not value:
        return set()
    out: set[Key] = set()
    for target in stmt.targets:
        if position is not None:
            if not isinstance(target, (ast.Tuple, ast.List)) or position >= len(target.elts):
                continue
            if any(isinstance(e, ast.Starred) for e in target.elts):
                continue
            target = target.elts[position]
        if isinstance(target, (ast.Name, ast.Attribute)):
            k = model.roles.key(target)
            if k is not None:
                out.add(k)
    return out


def _parameter(model: FileModel, site: ast.Call, arg: ast.AST) -> set[Key]:
    """The key of the parameter of a same-file function or class that ``site`` fills
    with ``arg``."""
    fn = model.resolve_call(site)
    if fn is None and isinstance(site.func, ast.Name):
        cls = model.class_named(site.func.id)
        fn = model.method_of(cls, "__init__") if cls is not None else None
    name = parameter_for(model, site, fn, arg) if fn is not None else None
    return {("name", id(fn), name)} if name is not None else set()


def refers(model: FileModel, expr: ast.AST, keys: set[Key], calls: list[ast.Call]) -> bool:
    """Is ``expr`` one of ``calls`` or a name/attribute bound to what they build?"""
    if any(expr is c for c in calls):
        return True
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return model.roles.key(expr) in keys
    return False


def handed_over(model: FileModel, calls: list[ast.Call], keys: set[Key]) -> bool:
    """Is the loader passed to a framework call that takes it over (``accelerator.prepare``)?"""
    for method in HANDED_OVER:
        for site in model.calls.get(method, ()):
            args = [*site.args, *(k.value for k in site.keywords)]
            if any(refers(model, a, keys, calls) for a in args):
                return True
    return False


def training_loops_over(
    model: FileModel, calls: list[ast.Call], keys: set[Key]
) -> list[ast.For | ast.AsyncFor]:
    """Step loops (loops that backpropagate or step an optimizer) whose iterable is the
    loader, or a parameter of a same-file function that some call site fills with it."""
    direct, passed = loops_iterating(model, calls, keys)
    hits = {id(loop): (order, loop) for order, loop in direct}
    hits.update((id(loop), (order, loop)) for order, loop, _site in passed)
    return [loop for _, loop in sorted(hits.values(), key=lambda hit: hit[0])]


def loops_iterating(
    model: FileModel, calls: list[ast.Call] | tuple[ast.Call, ...], keys: set[Key] | frozenset[Key],
    *, epoch_loops: bool = False,
) -> tuple[list[tuple[int, ast.For | ast.AsyncFor]], list[tuple[int, ast.For | ast.AsyncFor, ast.Call]]]:
    """The step loops (with ``epoch_loops``, also the epoch loops) that iterate an object
    given by its constructions ``calls`` and the role ``keys`` bound to it: those whose
    iterable spells it (``for x in loader``), as (order, loop); and those whose iterable is
    a parameter of the loop's function that a same-file call site fills with it
    (``train(model, loader)``), as (order, loop, call site). Indexed once per file, so
    asking for every loader or sampler of a file stays linear in its size."""
    index = model.memo(("loop-iterables", epoch_loops), lambda m: _LoopIterables(m, epoch_loops))
    direct: dict[int, tuple[int, ast.For | ast.AsyncFor]] = {}
    passed: list[tuple[int, ast.For | ast.AsyncFor, ast.Call]] = []
    for table, via in ((index.direct, False), (index.passed, True)):
        found = [*(table.get(id(c), ()) for c in calls), *(table.get(k, ()) for k in keys)]
        for entries in found:
            for entry in entries:
                if via:
                    passed.append(entry)  # type: ignore[arg-type]
                else:
                    direct[id(entry[1])] = entry  # type: ignore[assignment]
    return sorted(direct.values(), key=lambda e: e[0]), sorted(passed, key=lambda e: e[0])


class _LoopIterables:
    """What each training loop iterates, by the id of a construction its iterable spells
    (``for x in DataLoader(ds)``) and by the role key of a name in it; and, through a
    parameter of the loop's function, by what its same-file call sites pass."""

    def __init__(self, model: FileModel, epoch_loops: bool) -> None:
        steps = model.steps
        training = steps.step_loop_ids
        if epoch_loops:
            training = training | {id(e) for e in steps.epoch_loops}
        self._key_of = model.roles.key
        self.direct: dict[object, list[tuple[int, ast.For | ast.AsyncFor]]] = {}
        self.passed: dict[object, list[tuple[int, ast.For | ast.AsyncFor, ast.Call]]] = {}
        for order, loop in enumerate(model.loops):
            if not isinstance(loop, (ast.For, ast.AsyncFor)) or id(loop) not in training:
                continue
            refs: list[ast.AST] = [
                n
                for n in ast.walk(loop.iter)
                if isinstance(n, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
            ]
            refs += _unwrapped(model, refs)
            for n in refs:
                self._add(self.direct, n, (order, loop))
            fn = model.function_of(loop)
            if fn is None:
                continue
            params = set(parameter_names(fn))
            for n in refs:
                if isinstance(n, ast.Name) and n.id in params:
                    for site, arg in arguments_for(model, fn, n.id):
                        self._add(self.passed, arg, (order, loop, site))

    def _add(self, table: dict[object, list], expr: ast.AST, entry: tuple) -> None:  # type: ignore[type-arg]
        if isinstance(expr, ast.Call):
            table.setdefault(id(expr), []).append(entry)
        elif isinstance(expr, ast.Subscript):  # `loaders["train"]`, by the dict's key
            item = _entry(expr, expr.value)
            base = self._key_of(expr.value) if item is not None else None
            if base is not None:
                table.setdefault(("item", base, item), []).append(entry)
        elif isinstance(expr, (ast.Name, ast.Attribute)):
            k = self._key_of(expr)
            if k is not None:
                table.setdefault(k, []).append(entry)


_WRAPPERS = ("enumerate", "tqdm", "iter", "track", "progress_bar")


def _unwrapped(model: FileModel, refs: list[ast.AST]) -> list[ast.AST]:
    """What a progress-bar or iterator name bound earlier wraps: ``bar = tqdm(loader)``
    then ``for x in bar`` iterates ``loader`` itself. Followed through a chain of such
    bindings (``bar = tqdm(enumerate(loader))``), never through any other call."""
    out: list[ast.AST] = []
    todo = [n for n in refs if isinstance(n, ast.Name)]
    seen: set[int] = set()
    while todo:
        name = todo.pop()
        found = model.flow.definition(name.id, name)
        if found is None or id(found[1]) in seen:
            continue
        seen.add(id(found[1]))
        value = found[1]
        while isinstance(value, ast.Call) and call_name(value) in _WRAPPERS and value.args:
            value = value.args[0]
        if value is found[1] or not isinstance(value, (ast.Name, ast.Attribute, ast.Call)):
            continue
        inner = [n for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))]
        out += inner
        todo += [n for n in inner if isinstance(n, ast.Name)]
    return out
_MAP_BASES = {"torch.utils.data.Dataset", "torch.utils.data.dataset.Dataset"}
# Map-style datasets whose items are already tensors in memory: a worker would only add
# inter-process copies.
_IN_MEMORY = {"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"}


def loader_of_loop(model: FileModel, loop: ast.AST) -> Binding | None:
    """The `DataLoader` construction a ``for`` loop iterates (through `enumerate`/`tqdm`)."""
    it = getattr(loop, "iter", None)
    while isinstance(it, ast.Call) and call_name(it) in _WRAPPERS and it.args:
        it = it.args[0]
    if not isinstance(it, (ast.Name, ast.Attribute)):
        return None
    binding = model.roles.lookup(it)
    if binding is None or binding.role is not Role.LOADER or binding.call is None:
        return None
    return binding if binding.qualname == DATA_LOADER else None


_ITER_WRAPPERS = ("enumerate", "tqdm", "iter", "zip", "islice", "progress_bar", "track")


def goes_over_data(loop: ast.AST) -> bool:
    """Does ``loop`` go over a data set (a loader, batches, `range(len(loader))`), rather
    than repeat a fixed input, step a decoder, or walk a literal tuple of models?"""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False  # `while len(returns) < n`: an environment rollout or a decode loop
    it: ast.AST = loop.iter
    while isinstance(it, ast.Call) and call_name(it) in _ITER_WRAPPERS and it.args:
        it = it.args[0]
    if isinstance(it, (ast.List, ast.Tuple, ast.Set, ast.Constant)):
        return False
    if isinstance(it, ast.Call) and call_name(it) == "range":
        return any(
            isinstance(sub, ast.Call) and call_name(sub) == "len"
            for arg in it.args
            for sub in ast.walk(arg)
        )
    return True


def content_nodes(model: FileModel, expr: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``expr`` that can decide the values it holds: all of them but the
    device argument of a device copy. ``x.to(f"cuda:{rank}")`` holds ``x``'s values, the
    same on every rank; only where they live depends on the rank."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.Call) and device_copy(model, node) is not None:
            stack.append(node.func)
        else:
            stack.extend(ast.iter_child_nodes(node))


def dataset_arg(call: ast.Call) -> ast.expr | None:
    return call.args[0] if call.args else keyword(call, "dataset")


def reads_from_disk_or_transforms(model: FileModel, dataset: ast.AST) -> bool:
    """Is ``dataset`` certainly map-style with per-item work: a torchvision dataset, or a
    same-file `Dataset` subclass with a `__getitem__`? Not an in-memory `TensorDataset`,
    not an `IterableDataset`, not anything unknown."""
    if isinstance(dataset, ast.Name):
        found = model.flow.definition(dataset.id, dataset)
        if found is None or not isinstance(found[1], ast.expr):
            return False
        if not dominates(model, found[0], dataset):
            return False
        dataset = found[1]
    if not isinstance(dataset, ast.Call):
        return False
    qual = model.qualname(dataset.func)
    if qual in _IN_MEMORY:
        return False
    if qual is not None:
        parts = qual.split(".")
        return qual.startswith("torchvision.datasets.") and parts[-1][:1].isupper()
    if not isinstance(dataset.func, ast.Name):
        return False
    cls = model.class_named(dataset.func.id)
    if cls is None or model.method_of(cls, "__getitem__") is None:
        return False
    seen: set[int] = set()
    cur: ast.ClassDef | None = cls
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for base in cur.bases:
            if model.qualname(base) in _MAP_BASES:
                return True
        cur = model.local_base(cur)
    return False


def _target_names(loop: ast.AST) -> set[str]:
    target = getattr(loop, "target", None)
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} if target else set()


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        node = node.value
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value  # `batch.float().to(device)`
        while isinstance(node, (ast.Subscript, ast.Attribute)):
            node = node.value
    return node


def batch_copies(model: FileModel, loop: ast.AST) -> list[ast.Call]:
    """Device copies, in the loop's body, of what the loop takes from its iterable: the
    loop variables, their items and attributes, and comprehension variables over them."""
    names = _target_names(loop)
    if not names:
        return []
    for stmt in getattr(loop, "body", ()):
        # `x, y = batch`, `x = batch["image"]`: parts of the batch under other names
        if isinstance(stmt, ast.Assign):
            root = _root(stmt.value)
            if isinstance(root, ast.Name) and root.id in names:
                for target in stmt.targets:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    fn = model.function_of(loop)
    out = []
    for stmt in getattr(loop, "body", ()):
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call) or model.function_of(node) is not fn:
                continue
            moved = device_copy(model, node)
            if moved is None:
                continue
            root = _root(moved)
            if isinstance(root, ast.Name) and (root.id in names or _over_batch(model, root, names)):
                out.append(node)
    return out


def _over_batch(model: FileModel, name: ast.Name, batch: set[str]) -> bool:
    """``v`` in ``{k: v.to(d) for k, v in batch.items()}``."""
    for anc in model.ancestors(name):
        if isinstance(anc, (ast.DictComp, ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            for gen in anc.generators:
                bound = {n.id for n in ast.walk(gen.target) if isinstance(n, ast.Name)}
                root = _root(gen.iter)
                if name.id in bound and isinstance(root, ast.Name) and root.id in batch:
                    return True
        if isinstance(anc, ast.stmt):
            return False
    return False


def over_fixed_input(model: FileModel, loop: ast.AST) -> bool:
    """``for c in range(len(seq))`` where ``seq`` is built in the same function from
    literals only (``to_tensor("hello")``, ``torch.LongTensor([1, 2, 3])``): the loop
    steps through one fixed example (a decode demo), not through a data set."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it = loop.iter
    if not (
        isinstance(it, ast.Call)
        and call_name(it) == "range"
        and len(it.args) == 1
        and isinstance(it.args[0], ast.Call)
        and call_name(it.args[0]) == "len"
        and len(it.args[0].args) == 1
        and isinstance(it.args[0].args[0], ast.Name)
    ):
        return False
    seq = it.args[0].args[0]
    found = model.flow.definition(seq.id, seq)
    if found is None or not isinstance(found[1], ast.Call):
        return False
    if model.function_of(found[0]) is not model.function_of(loop):
        return False
    return _literal_only(found[1])


def _literal_only(node: ast.AST) -> bool:
    """A call whose arguments are literals, or calls of literals, all the way down."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_literal_only(e) for e in node.elts)
    if isinstance(node, ast.Call):
        args = [*node.args, *(k.value for k in node.keywords)]
        return bool(args) and all(_literal_only(a) for a in args)
    return False


# Spellings that say the data or the branch already depends on the rank.
_RANK_WORDS = re.compile(
    r"rank|world|shard|replica|distributed|ddp|is_initialized|split_dataset_by_node|"
    r"n_?gpu|num_gpu|multi_?gpu|node",
    re.IGNORECASE,
)
# `DataLoader` options that shape batches or workers, never which items a rank reads.
_OPTIONS = frozenset(
    {
        "batch_size", "shuffle", "num_workers", "collate_fn", "pin_memory",
        "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator",
        "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
        "num_neighbors",
    }
)


def rank_dependent_data(model: FileModel, call: ast.Call, kwargs: dict[str, ast.expr]) -> bool:
    """Does what the loader ``call`` reads (its dataset, or another argument that picks
    the items, like a subclass's ``input_nodes=``; ``kwargs`` are the keywords it
    receives), or a value it is built from, up to three assignments back, name the rank,
    the world size or a shard? Not where the rank only picks the device its tensors are
    copied to (``x.to(f"cuda:{rank}")``): every rank holds the same data. True when the
    data cannot be told."""
    plain = is_plain_loader(model, call)
    data = [*call.args[:1], *(call.args[3:] if plain else call.args[1:])]
    data += [v for k, v in kwargs.items() if k not in _OPTIONS]
    if not data:
        return True  # cannot tell
    todo: list[tuple[ast.AST, int]] = [(d, 0) for d in data]
    scope = model.scope_of(call)
    while todo:
        expr, depth = todo.pop()
        content = list(content_nodes(model, expr))
        if mentions_rank(content):
            return True
        if depth >= 3:
            continue
        names = {n.id for n in content if isinstance(n, ast.Name)}
        for node in model.assignments_in(scope):
            if node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(
                isinstance(t, ast.Name) and t.id in names for tgt in targets for t in ast.walk(tgt)
            ):
                todo.append((node.value, depth + 1))
    return False


def mentions_rank(nodes: Iterable[ast.AST]) -> bool:
    """Does a name, attribute or keyword among ``nodes`` say rank, world size or shard?"""
    for n in nodes:
        word = (
            n.id
            if isinstance(n, ast.Name)
            else n.attr
            if isinstance(n, ast.Attribute)
            else n.arg
            if isinstance(n, ast.keyword)
            else None
        )
        if word and _RANK_WORDS.search(word):
            return True
    return False


def true_by_default(model: FileModel, expr: ast.AST | None) -> bool:
    """Is ``expr`` True when the callers of its function leave its parameters at their
    defaults: ``True``, or ``not p`` for a parameter ``p`` whose default is ``False`` or
    ``None`` (``shuffle=not deterministic`` in ``def load(..., deterministic=False)``)?"""
    if is_true(expr):
        return True
    if not (isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not)):
        return False
    name = expr.operand
    fn = model.function_of(expr)
    if not isinstance(name, ast.Name) or fn is None:
        return False
    if any(stmt is not fn for stmt, _ in model.flow.definitions_before(name.id, expr)):
        return False  # rebound in the function: not the parameter's value
    default = default_of(fn, name.id)
    return isinstance(default, ast.Constant) and default.value in (False, None)


def leaves_unread(model: FileModel, call: ast.Call, keys: set[Key]) -> bool:
    """Does the object ``call`` builds leave this file (returned, kept on an object,
    passed to a call) without a loop here iterating it? Whoever iterates it is elsewhere."""
    direct, passed = loops_iterating(model, [call], keys, epoch_loops=True)
    if direct or passed:
        return False
    query = objects(model)
    obj = query.of(call)
    obj = Obj(obj.calls, obj.keys | frozenset(keys))
    return any(k[0] == "attr" for k in obj.keys) or query.escapes(obj)
