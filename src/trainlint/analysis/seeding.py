"""Random seeding: which calls seed the random generators, which statements claim
reproducibility (deterministic cuDNN / algorithms), and where models get their random
initial weights."""

from __future__ import annotations

import ast
import re

from trainlint.analysis.model import FileModel, FunctionNode, call_name, is_true, walk_local
from trainlint.analysis.roles import is_module_class

#: Calls that seed torch's generator (what a freshly built model's weights come from).
TORCH_SEEDERS = frozenset(
    {
        "torch.manual_seed",
        "torch.random.manual_seed",
        "torch.cuda.manual_seed_all",
        "transformers.set_seed",
        "transformers.trainer_utils.set_seed",
        "accelerate.utils.set_seed",
        "pytorch_lightning.seed_everything",
        "lightning.seed_everything",
        "lightning.pytorch.seed_everything",
        "lightning.fabric.seed_everything",
        "lightning_fabric.utilities.seed.seed_everything",
        "pytorch_lightning.utilities.seed.seed_everything",
        "mmengine.runner.set_random_seed",
        "timm.utils.random_seed",
    }
)
_SEED_WORD = re.compile(r"seed", re.IGNORECASE)
_CUDNN_DETERMINISTIC = "torch.backends.cudnn.deterministic"
_DETERMINISTIC_CALLS = {"torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode"}


def seed_calls(model: FileModel) -> list[ast.Call]:
    """Every call that may seed something: a known seeder, or any call whose name says
    `seed` (a project's own `set_seed(args.seed)`, `np.random.seed`, `rng.seed`)."""

    def build(m: FileModel) -> list[ast.Call]:
        out = [c for name, calls in m.calls.items() if _SEED_WORD.search(name) for c in calls]
        out.sort(key=lambda c: (c.lineno, c.col_offset))
        return out

    return model.memo("seeding.seed_calls", build)


def seeds_torch(model: FileModel, call: ast.Call, depth: int = 0) -> bool:
    """Does ``call`` certainly seed torch's generator: a known seeder, or a same-file
    function that calls one?"""
    if model.qualname(call.func) in TORCH_SEEDERS:
        return True
    target = model.resolve_call(call)
    if target is None or depth > 2:
        return False
    return any(
        isinstance(n, ast.Call) and seeds_torch(model, n, depth + 1) for n in walk_local(target)
    )


def determinism_claims(model: FileModel) -> list[ast.stmt | ast.expr]:
    """`torch.backends.cudnn.deterministic = True`, `torch.use_deterministic_algorithms(True)`."""
    out: list[ast.stmt | ast.expr] = []
    for node in model.assignments:
        if isinstance(node, ast.Assign) and is_true(node.value):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and (
                    model.qualname(target) == _CUDNN_DETERMINISTIC
                ):
                    out.append(node)
    for call in model.calls_to(*_DETERMINISTIC_CALLS):
        arg = call.args[0] if call.args else None
        if call_name(call) == "use_deterministic_algorithms" and is_true(arg):
            out.append(call)
    out.sort(key=lambda n: (n.lineno, n.col_offset))
    return out


def randomly_initialised(model: FileModel, call: ast.Call) -> bool:
    """Does constructing ``call`` draw random initial weights: a same-file `nn.Module`
    subclass or a `torch.nn` layer, not a pretrained checkpoint or an unknown factory?"""
    func = call.func
    qual = model.qualname(func)
    if qual is not None:
        last = qual.rsplit(".", 1)[-1]
        return (
            qual.startswith("torch.nn.")
            and qual.count(".") == 2
            and last[:1].isupper()
            and (not last.endswith("Loss"))
            and last not in ("Parameter", "Module", "Identity")
        )
    if isinstance(func, ast.Name):
        cls = model.class_named(func.id)
        return cls is not None and is_module_class(model, cls)
    return False


def model_constructions(model: FileModel, fn: FunctionNode | ast.Module) -> list[ast.Call]:
    """Randomly initialised models built directly in ``fn`` (not in nested defs)."""
    out = []
    for node in walk_local(fn) if not isinstance(fn, ast.Module) else _module_level(fn):
        if isinstance(node, ast.Call) and randomly_initialised(model, node):
            out.append(node)
    return out


def _module_level(tree: ast.Module) -> list[ast.AST]:
    out: list[ast.AST] = []
    for stmt in tree.body:
        out.extend(walk_local(stmt))
    return out
