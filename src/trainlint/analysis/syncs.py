"""Which expressions read a device tensor to the host, and which of those reads run every training step."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from trainlint._record import Record
from trainlint.analysis.devices import device_in_sight
from trainlint.analysis.flow import Taint
from trainlint.analysis.model import FileModel, call_name, dotted, keyword, walk_local
from trainlint.analysis.steps import (
    StepLoop,
    after_limiting_exit,
    backward_calls,
    backward_value,
    off_training_branch,
)

_SYNC_METHODS = {"item", "cpu", "numpy", "tolist"}
_TO_HOST = {"item", "tolist", "numpy"}  # their result is no longer a tensor
#: Reductions over the whole tensor: called without a dim, their result is one number.
_REDUCTIONS = {
    "mean",
    "sum",
    "max",
    "min",
    "norm",
    "std",
    "var",
    "prod",
    "all",
    "any",
    "amax",
    "amin",
    "nansum",
    "nanmean",
    "median",
    "count_nonzero",
}
#: Methods that keep a tensor's shape (and so whether it is one number).
_SAME_SHAPE = {"detach", "float", "double", "half", "bfloat16", "clone", "contiguous", "squeeze"}
_FACTORIES = {
    "tensor",
    "as_tensor",
    "scalar_tensor",
    "zeros",
    "ones",
    "full",
    "empty",
    "zeros_like",
    "ones_like",
    "full_like",
    "empty_like",
    "arange",
    # the legacy constructors build on the host
    "Tensor",
    "FloatTensor",
    "DoubleTensor",
    "LongTensor",
    "IntTensor",
    "BoolTensor",
    "ByteTensor",
}
_DTYPE_WORDS = {
    "dtype",
    "float",
    "float16",
    "float32",
    "float64",
    "half",
    "double",
    "bfloat16",
    "int",
    "int8",
    "int16",
    "int32",
    "int64",
    "long",
    "short",
    "bool",
    "uint8",
    "complex64",
    "complex128",
}


class HostSync(Record, frozen=True):
    """One read of a device tensor to the host."""

    __slots__ = ("node", "what", "kind", "key", "value")

    node: ast.AST
    what: str  # the syncing call as the message names it
    kind: str  # "scalar" (one number read to the host), "copy" or "format"
    key: str  # the value read, as written
    value: tuple[str, int] | None  # a named value and its definition: read twice?

    def __init__(
        self, node: ast.AST, what: str, kind: str, key: str, value: tuple[str, int] | None = None
    ) -> None:
        self.node = node
        self.what = what
        self.kind = kind
        self.key = key
        self.value = value


def _from_batch(model: FileModel, expr: ast.AST) -> bool:
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Name):
            found = model.flow.definition(sub.id, sub)
            if found is not None and isinstance(found[0], (ast.For, ast.AsyncFor)):
                it = found[0].iter
                if isinstance(it, ast.Call) and call_name(it) == "range":
                    return False
                # the items of a model output, zipped with the batch moved beside it
                return not model.steps.over_step_tensors(found[0])
    return False


def _outer_call_name(model: FileModel, call: ast.Call) -> str | None:
    """``x.cpu().numpy()``: for the inner call, "numpy"."""
    attr = model.parent_of(call)
    outer = model.parent_of(attr) if isinstance(attr, ast.Attribute) else None
    return call_name(outer) if isinstance(outer, ast.Call) and outer.func is attr else None


def _param_gets_tensor(model: FileModel, expr: ast.AST) -> bool:
    """A helper's parameter that some same-file call site fills with a model-derived
    tensor: `update_meters(meters, loss)` then `float(loss)` inside the helper."""
    if not isinstance(expr, ast.Name):
        return False
    fn = model.function_of(expr)
    found = model.flow.definition(expr.id, expr) if fn is not None else None
    if found is None or found[0] is not fn:
        return False  # reassigned inside the helper
    params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    if expr.id not in params:
        return False
    index = params.index(expr.id)
    for site in model.call_sites.get(id(fn), ()):
        offset = (
            1
            if params and params[0] in ("self", "cls") and isinstance(site.func, ast.Attribute)
            else 0
        )
        args = {kw.arg: kw.value for kw in site.keywords}
        arg = args.get(expr.id)
        if arg is None and 0 <= index - offset < len(site.args):
            arg = site.args[index - offset]
        if arg is not None and model.flow.value(arg).taint in (Taint.GRAD, Taint.CUT):
            return True
    return False


def _device_tensor(model: FileModel, expr: ast.AST, *, lenient: bool) -> bool:
    """Is ``expr`` (probably) a tensor on an accelerator? Model-derived values are; batch
    data only once moved with `.to(...)`/`.cuda()`; unknown values only for `.item()`."""
    if isinstance(expr, ast.Constant) or _built_on_cpu(model, expr):
        return False
    v = model.flow.value(expr)
    if v.taint in (Taint.GRAD, Taint.CUT):
        return True
    if v.taint is Taint.DATA:
        return _moved_to_device(model, expr)
    return lenient and not _moved_to_cpu_data(model, expr)


def _moves_to_device(call: ast.Call) -> bool:
    """`.cuda()`, `.to(device)`, `.to(x)`; not `.to(torch.float32)` or `.to(dtype=...)`."""
    name = call_name(call)
    if name == "cuda":
        return True
    if name != "to":
        return False
    if keyword(call, "device") is not None:
        return True
    return any(
        not (
            isinstance(a, (ast.Attribute, ast.Name))
            and (dotted(a) or "").rsplit(".", 1)[-1] in _DTYPE_WORDS
        )
        for a in call.args
    )


def _moved_to_device(model: FileModel, expr: ast.AST) -> bool:
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Call) and _moves_to_device(sub):
            return True
        if isinstance(sub, ast.Name):
            found = model.flow.definition(sub.id, sub)
            if (
                found is not None
                and isinstance(found[1], ast.AST)
                and any(isinstance(c, ast.Call) and _moves_to_device(c) for c in ast.walk(found[1]))
            ):
                return True
    return False


def _moved_to_cpu_data(model: FileModel, expr: ast.AST) -> bool:
    return _from_batch(model, expr) and not _moved_to_device(model, expr)


def _torch_factory(model: FileModel, node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and call_name(node) in _FACTORIES
        and (model.qualname(node.func) or "").startswith("torch.")
    )


def _built_on_cpu(model: FileModel, expr: ast.AST) -> bool:
    """`torch.as_tensor(pad).to(dtype=t.dtype)`: made by a torch factory without a
    device and never moved, so reading it waits for nothing."""
    cur = expr
    while isinstance(cur, ast.Call) and not _torch_factory(model, cur):
        if _moves_to_device(cur) or not isinstance(cur.func, ast.Attribute):
            return False
        cur = cur.func.value
    return isinstance(cur, ast.Call) and keyword(cur, "device") is None


def _one_number(
    model: FileModel, expr: ast.AST, losses: set[str] | frozenset[str] = frozenset()
) -> bool:
    """Is the copied value one number: a reduction without a dim (`x.mean()`,
    `torch.mean(x)`), or a detached loss (`loss.detach().cpu()`, or `l.detach().cpu()`
    of the `l` that this file backpropagates: backward needs a scalar)?"""
    cur = expr
    detached = False
    while (
        isinstance(cur, ast.Call)
        and isinstance(cur.func, ast.Attribute)
        and call_name(cur) in _SAME_SHAPE
        and not cur.args
    ):
        detached = detached or call_name(cur) == "detach"
        cur = cur.func.value
    if isinstance(cur, ast.Call):
        if call_name(cur) not in _REDUCTIONS or keyword(cur, "dim") is not None:
            return False
        module = (model.qualname(cur.func) or "").split(".")[0] in ("torch", "numpy")
        return len(cur.args) == 1 if module else not cur.args
    name = (dotted(cur) or "").rsplit(".", 1)[-1].lower()
    return detached and ("loss" in name or dotted(cur) in losses)


def _device_factory(model: FileModel, node: ast.AST) -> bool:
    """`torch.zeros((), device=dev)`, `torch.tensor(0).cuda()`: a tensor made on a device."""
    moved = False
    while isinstance(node, ast.Call) and not _torch_factory(model, node):
        moved = moved or _moves_to_device(node)
        if not isinstance(node.func, ast.Attribute):
            return False
        node = node.func.value
    return _torch_factory(model, node) and (moved or keyword(node, "device") is not None)  # type: ignore[arg-type]


def _holds_tensor(model: FileModel, target: ast.AST) -> bool:
    """`counts["tokens"] += n` where `counts` was built from device tensors, or
    `total += n` where `total = torch.zeros((), device=dev)`."""
    base = target
    while isinstance(base, ast.Subscript):
        base = base.value
    name = dotted(base)
    if name is None:
        return False
    found = model.flow.definition(name, target)
    if found is None:
        return False
    value = found[1]
    if isinstance(value, ast.Dict):
        return base is not target and any(
            v is not None and _device_factory(model, v) for v in value.values
        )
    if isinstance(value, (ast.List, ast.Tuple)):
        return base is not target and any(_device_factory(model, v) for v in value.elts)
    return base is target and _device_factory(model, value)


def into_tensor(model: FileModel, node: ast.AST) -> bool:
    """The number read to the host goes straight back into a tensor."""
    for anc in model.ancestors(node):
        if _torch_factory(model, anc):
            return True
        if isinstance(anc, ast.stmt):
            return isinstance(anc, ast.AugAssign) and _holds_tensor(model, anc.target)
    return False


def _named_value(model: FileModel, expr: ast.AST) -> tuple[str, int] | None:
    """`loss_t` (or `loss_t.detach()`) as (name, id of its defining statement): two reads
    of the same pair read the same value; `fn()` read twice reads two values."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and call_name(expr) in _SAME_SHAPE
        and not expr.args
    ):
        expr = expr.func.value
    name = dotted(expr)
    if name is None:
        return None
    found = model.flow.definition(name, expr)
    return (name, id(found[0])) if found is not None else None


def _on_way_out(model: FileModel, node: ast.AST, loop: ast.AST) -> bool:
    """In a block of the step loop that ends with `break` or `return`: it runs once, on
    the last step, not on every step."""
    if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
        return False  # a step function: its `return` ends every step
    cur = model.statement_of(node)
    for anc in model.ancestors(cur):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        for field_name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(anc, field_name, None)
            if not (isinstance(block, list) and any(s is cur for s in block)):
                continue
            last = block[-1]
            if isinstance(last, ast.Return) or (
                isinstance(last, ast.Break) and _loop_around(model, last) is loop
            ):
                return True
        if anc is loop:
            return False
        if isinstance(anc, ast.stmt):
            cur = anc
    return False


def _loop_around(model: FileModel, node: ast.AST) -> ast.AST | None:
    for anc in model.ancestors(node):
        if isinstance(anc, (ast.For, ast.AsyncFor, ast.While)):
            return anc
    return None


def _is_env_step(call: ast.AST) -> bool:
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr in ("step", "step_async")
    ):
        return False
    return "env" in (dotted(call.func.value) or "").rsplit(".", 1)[-1].lower()


def _feeds_env(model: FileModel, node: ast.AST) -> bool:
    """`actions = policy(obs).cpu().numpy()` then `env.step(actions)`: the environment
    needs host data, so this copy is the price of stepping it, not a hidden sync."""
    for anc in model.ancestors(node):
        if _is_env_step(anc):
            return True
        if isinstance(anc, ast.stmt):
            break
    stmt = model.statement_of(node)
    targets = (
        stmt.targets
        if isinstance(stmt, ast.Assign)
        else ([stmt.target] if isinstance(stmt, ast.AnnAssign) else [])
    )
    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if not names:
        return False
    after = (stmt.lineno, stmt.col_offset)
    for sub in walk_local(model.function_of(stmt) or model.tree):
        if (
            _is_env_step(sub)
            and (sub.lineno, sub.col_offset) > after  # type: ignore[attr-defined]
            and any(
                isinstance(a, ast.Name) and a.id in names
                for a in (*sub.args, *(k.value for k in sub.keywords))  # type: ignore[attr-defined]
            )
        ):
            return True
    return False


def host_syncs(model: FileModel, where: Callable[[ast.AST], bool] | None = None) -> list[HostSync]:
    """Every host read of a device tensor in the file, in source order; with ``where``,
    only the reads at nodes it accepts (asked before the costly flow questions)."""
    losses = {
        name
        for c in backward_calls(model)
        if (v := backward_value(model, c)) is not None and (name := dotted(v))
    }
    found: list[HostSync] = []
    for name in _SYNC_METHODS:
        for call in model.calls.get(name, ()):
            func = call.func
            if not isinstance(func, ast.Attribute) or call.args or call.keywords:
                continue
            recv = func.value
            what = f"`.{name}()`"
            if (
                name in ("numpy", "tolist")
                and isinstance(recv, ast.Call)
                and (call_name(recv) == "cpu")
            ):
                recv = recv.func.value  # type: ignore[attr-defined]
                what = f"`.cpu().{name}()`"
            elif name == "numpy":
                continue  # .numpy() needs a CPU tensor: only a .cpu() right before it syncs
            elif name == "cpu" and _outer_call_name(model, call) in ("numpy", "tolist", "item"):
                continue  # one sync, reported at the outer call
            if where is not None and not where(call):
                continue
            if not _device_tensor(model, recv, lenient=name in ("item", "cpu", "numpy")):
                continue
            scalar = (
                name == "item"
                or _one_number(model, recv, losses)
                or (dotted(recv) in losses and name == "tolist")
            )
            if isinstance(recv, ast.Call) and call_name(recv) == "cpu" and name == "item":
                recv = recv.func.value  # type: ignore[attr-defined]
            found.append(
                HostSync(
                    call,
                    what,
                    "scalar" if scalar else "copy",
                    ast.unparse(recv),
                    _named_value(model, recv),
                )
            )
    for call in model.calls_to("builtins.float", "builtins.int", "builtins.print"):
        fname = call_name(call)
        if where is not None and not where(call):
            continue
        if any(_tensor_arg(model, a) for a in call.args):
            number = _formatted_number(model, call.args) if fname == "print" else None
            if number is not None:
                found.append(_number_format(model, call, number))
            elif fname == "print":
                found.append(HostSync(call, "`print()` of a tensor", "format", ""))
            elif call.args:
                arg = call.args[0]
                found.append(
                    HostSync(
                        call,
                        f"`{fname}()` of a tensor",
                        "scalar",
                        ast.unparse(arg),
                        _named_value(model, arg),
                    )
                )
    # The model's f-string table, not a walk of the whole tree: the table is in no set
    # order, but the sort below is by position and f-strings that share one (the format
    # specs of one f-string, on Python < 3.12) make identical findings in one statement.
    for node in model.fstrings:
        parent = model.parent_of(node)
        if isinstance(parent, ast.Call) and call_name(parent) == "print":
            continue  # reported as print(...) if it formats a tensor
        if where is not None and not where(node):
            continue
        if any(
            isinstance(v, ast.FormattedValue) and _tensor_arg(model, v.value) for v in node.values
        ):
            number = _formatted_number(model, [node])
            if number is not None:
                found.append(_number_format(model, node, number))
            else:
                found.append(HostSync(node, "an f-string of a tensor", "format", ""))
    found.sort(key=lambda s: (getattr(s.node, "lineno", 0), getattr(s.node, "col_offset", 0)))
    return found


def _formatted_number(model: FileModel, args: list[ast.expr]) -> ast.expr | None:
    """The tensor that ``args`` (a print's arguments, or one f-string) format, when every
    tensor among them is formatted with a spec (`f"{loss:.4f}"`): `Tensor.__format__`
    with a spec works only on a 0-dim tensor and reads it like `.item()`, one number."""
    first: ast.expr | None = None
    for arg in args:
        if not _tensor_arg(model, arg):
            continue
        if not isinstance(arg, ast.JoinedStr):
            return None  # `print(t)`: the whole tensor
        for v in arg.values:
            if isinstance(v, ast.FormattedValue) and _tensor_arg(model, v.value):
                if v.format_spec is None:
                    return None
                first = first or v.value
    return first


def _number_format(model: FileModel, node: ast.AST, value: ast.expr) -> HostSync:
    return HostSync(
        node,
        f"formatting `{ast.unparse(value)}` as a number",
        "scalar",
        ast.unparse(value),
        _named_value(model, value),
    )


def _tensor_arg(model: FileModel, expr: ast.AST) -> bool:
    """Does converting or formatting ``expr`` read a device tensor?"""
    if isinstance(expr, ast.JoinedStr):
        return any(
            isinstance(v, ast.FormattedValue) and _tensor_arg(model, v.value) for v in expr.values
        )
    if isinstance(expr, ast.Call) and (
        call_name(expr) in _SYNC_METHODS
        or model.qualname(expr.func) in ("builtins.float", "builtins.int")
    ):
        return False  # the inner .item() or float() is the sync, reported on its own
    v = model.flow.value(expr)
    if (
        v.taint is Taint.CUT
        and v.cuts
        and all(isinstance(c, ast.Call) and call_name(c) in _TO_HOST for c in v.cuts)
    ):
        return False  # `v = loss.item()`: already a Python number, formatting it is free
    if v.taint in (Taint.GRAD, Taint.CUT):
        return True
    return v.taint is Taint.UNKNOWN and _param_gets_tensor(model, expr)


def per_step_syncs(model: FileModel) -> Iterator[tuple[HostSync, StepLoop, ast.AST]]:
    """(read, its step loop, where to report it) for each host read that runs on every
    step: not under a rate limit, after an early exit on one, on the way out of the loop,
    nor a copy of actions that `env.step(...)` needs on the host."""
    # Whether a read runs every step is asked first: most of a file's reads (setup,
    # logging, evaluation) fail it, and then their costly flow questions are never asked.
    per_step: dict[int, tuple[StepLoop, ast.AST] | None] = {}

    def in_step(node: ast.AST) -> bool:
        found = per_step[id(node)] = model.steps.per_step(node, per_item=True)
        return found is not None

    for sync in host_syncs(model, in_step):
        found = per_step[id(sync.node)]
        if found is None:
            continue
        loop, anchor = found
        if (
            cpu_only(model, loop.node)
            or after_limiting_exit(model, sync.node, loop.node)
            or _on_way_out(model, sync.node, loop.node)
            or off_training_branch(model, sync.node, loop.node)
        ):
            continue
        if sync.kind == "copy" and _feeds_env(model, sync.node):
            continue
        yield sync, loop, anchor


def cpu_only(model: FileModel, loop: ast.AST) -> bool:
    """Does the step loop ``loop`` train on the CPU: a script (the loop at module level,
    or in a function this file calls) that never names a device nor uses a framework
    that would place the model? A step function that other files call gets its tensors
    from them (a library's `train_step`): there the file cannot tell, so not CPU-only."""
    if device_in_sight(model):
        return False
    fn = (
        loop
        if isinstance(loop, (ast.FunctionDef, ast.AsyncFunctionDef))
        else model.function_of(loop)
    )
    return fn is None or bool(model.call_sites.get(id(fn)))


def per_item(model: FileModel, node: ast.AST, loop: ast.AST) -> bool:
    """Is ``node`` in a loop over the step's own tensors, inside step loop ``loop``: a
    read per sample, box or image, many syncs per step?"""
    for anc in model.ancestors(node):
        if anc is loop or isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(anc, (ast.For, ast.AsyncFor)) and model.steps.over_step_tensors(anc):
            return True
    return False


#: Clock reads: a synchronize right before one makes the measurement honest.
_CLOCKS = {
    "time.time",
    "time.perf_counter",
    "time.monotonic",
    "time.process_time",
    "time.time_ns",
    "time.perf_counter_ns",
    "time.monotonic_ns",
    "timeit.default_timer",
}
#: Timer objects' start/stop marks (`fw_timer.tic()`, `timer.toc()`), and CUDA events'
#: `elapsed_time`, which needs the end event completed.
_TIMER_METHODS = {"tic", "toc", "elapsed_time"}


def _is_cuda_event(model: FileModel, expr: ast.AST) -> bool:
    name = dotted(expr)
    found = model.flow.definition(name, expr) if name else None
    return (
        found is not None
        and isinstance(found[1], ast.Call)
        and model.qualname(found[1].func) in ("torch.cuda.Event", "torch.Event", "torch.xpu.Event")
    )


def reads_clock(model: FileModel, stmt: ast.AST) -> bool:
    """Does ``stmt`` read or mark a clock: `time.perf_counter()`, a timer's `tic()`/`toc()`,
    CUDA events' `start.record()` or `start.elapsed_time(end)`? A synchronize right before
    it is deliberate timing, not a leftover."""
    for c in ast.walk(stmt):
        if not isinstance(c, ast.Call):
            continue
        if model.qualname(c.func) in _CLOCKS or call_name(c) in _TIMER_METHODS:
            return True
        if (
            call_name(c) == "record"
            and isinstance(c.func, ast.Attribute)
            and _is_cuda_event(model, c.func.value)
        ):
            return True
    return False


#: torch calls that queue no device work.
_HOST_ONLY_TORCH = ("torch.cuda.is_available", "torch.distributed.get_", "torch.cuda.device_count")


def _reads_to_host(stmt: ast.AST) -> bool:
    return any(
        isinstance(c, ast.Call)
        and call_name(c) in ("item", "tolist", "cpu", "synchronize")
        and isinstance(c.func, ast.Attribute)
        for c in ast.walk(stmt)
    )


def _queues_device_work(model: FileModel, stmt: ast.AST) -> bool:
    """Might ``stmt`` queue kernels: a torch call, a training event, a call whose value
    carries autograd history? Unknown calls on plain Python values (a meter's
    `update(loss_value, n)`) do not."""
    for c in ast.walk(stmt):
        if not isinstance(c, ast.Call):
            continue
        qual = model.qualname(c.func) or ""
        if qual.startswith("torch.") and not qual.startswith(_HOST_ONLY_TORCH):
            return True
        if model.steps.classify(c) is not None:
            return True
        if model.flow.value(c).taint is Taint.GRAD:
            return True
    return False


def queue_drained_before(model: FileModel, node: ast.AST) -> bool:
    """Has the host already waited for the GPU right before ``node``: an earlier statement
    of the same step read a tensor to the host (`loss.item()`) and nothing since queued
    device work? Then another sync at ``node`` waits for nothing."""
    cur: ast.AST = model.statement_of(node)
    for anc in model.ancestors(cur):
        for field_name in ("body", "orelse", "finalbody"):
            block = getattr(anc, field_name, None)
            if not (isinstance(block, list) and any(s is cur for s in block)):
                continue
            for stmt in reversed(block[: [id(s) for s in block].index(id(cur))]):
                # A simple statement's read comes after the work it queues itself
                # (`loss = model(x).mean().item()`); a block's order is not that plain.
                simple = not hasattr(stmt, "body")
                if simple and _reads_to_host(stmt):
                    return True
                if _queues_device_work(model, stmt):
                    return False
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(anc, (ast.For, ast.AsyncFor, ast.While)):
            return False  # the previous iteration's reads came before this step's work
        if isinstance(anc, ast.stmt):
            if isinstance(anc, ast.If) and _queues_device_work(model, anc.test):
                return False
            cur = anc
    return False


def timing_only_kept(model: FileModel, sync: ast.AST, loop: ast.AST) -> bool:
    """Is the clock read right after ``sync`` (``t = start.elapsed_time(end)``) only kept
    for later: every use of the name it assigns, in ``loop``, appends it to a container
    (``times.append(t)``) that nothing else in the loop reads? The per-step reading then
    serves a summary after the loop, which wall-clock time at the end gives without a
    synchronize per step. False where the time is logged, compared or read per step."""
    stmt = model.statement_of(sync)
    parent = model.parent_of(stmt)
    block = next(
        (
            b
            for b in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody"))
            if isinstance(b, list) and any(s is stmt for s in b)
        ),
        None,
    )
    if block is None:
        return False
    i = next(k for k, s in enumerate(block) if s is stmt)
    nxt = block[i + 1] if i + 1 < len(block) else None
    if not (
        isinstance(nxt, ast.Assign)
        and len(nxt.targets) == 1
        and isinstance(nxt.targets[0], ast.Name)
    ):
        return False
    name = nxt.targets[0].id
    after = (nxt.lineno, nxt.col_offset)
    containers: set[str] = set()
    for n in walk_local(loop):
        if not (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)):
            continue
        if (n.lineno, n.col_offset) <= after:
            return False  # read before it is assigned again: last step's time, per step
        call = model.parent_of(n)
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "append"
            and call.args == [n]
        ):
            return False
        container = dotted(call.func.value)
        if container is None:
            return False
        containers.add(container)
    if not containers:
        return False
    for n in walk_local(loop):
        if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) in containers:
            up = model.parent_of(n)
            if not (isinstance(up, ast.Attribute) and up.attr == "append"):
                return False
    return True
