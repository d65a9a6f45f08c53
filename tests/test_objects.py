"""The shared object queries of ``analysis/``: the constant evaluator, the torch table of
calls that keep or copy a module, and where an object goes and what is called on it."""

from __future__ import annotations

import ast
import math

import pytest

from trainlint.analysis.constants import ConstantEvaluator
from trainlint.analysis.model import FileModel
from trainlint.source import Source


def build(src: str) -> FileModel:
    return FileModel(ast.parse(src), Source(src))


def value_of(src: str, name: str) -> object:
    model = build(src)
    for node in model.tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ConstantEvaluator(model).expr(node.value, {})
    raise AssertionError(name)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("pow(2, 3)", 8),
        ("math.cos(math.pi * 0)", 1.0),
        ("m.sqrt(16)", 4.0),
        ("c(0.0)", 1.0),
        ("max(1, 2) + min(3, 4)", 5),
        ("math.pow(2, 10)", 1024.0),
        ("0.5 * (1 + math.cos(math.pi * 1))", 0.0),
        ("math.log(-1)", None),  # a domain error is unknown, not a crash
    ],
)
def test_constant_evaluator_knows_pow_min_max_and_math(expr: str, expected: object) -> None:
    src = f"import math\nimport math as m\nfrom math import cos as c\nv = {expr}\n"
    got = value_of(src, "v")
    if isinstance(expected, float):
        assert isinstance(got, float) and math.isclose(got, expected, abs_tol=1e-12)
    else:
        assert got == expected


def test_constant_evaluator_shadowed_math_is_not_math() -> None:
    src = "class math:\n    pi = 3\nv = math.pi\n"
    assert value_of(src, "v") != math.pi


# -- the torch table: one list of calls that keep or copy a module --------------------


@pytest.mark.parametrize(
    "wrapped",
    [
        "FSDP(model)",
        "torch.jit.script(model)",
        "torch.compile(model)",
        "model.to(dev).apply(init)",
        "DDP(model.cuda())",
    ],
)
def test_escapes_unwraps_every_parameter_sharing_wrapper(wrapped: str) -> None:
    from trainlint.analysis.escapes import escapes

    src = (
        "import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        f"w = {wrapped}\n"
    )
    model = build(src)
    value = model.tree.body[-1].value  # type: ignore[attr-defined]
    unwrapped = escapes(model).unwrap(value)
    assert isinstance(unwrapped, ast.Name) and unwrapped.id == "model"


def test_roles_and_tl107_share_the_table() -> None:
    from trainlint.analysis import torch_table
    from trainlint.analysis.roles import Role

    src = (
        "import torch\nfrom torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"
        "class Net(torch.nn.Module):\n    pass\n"
        "net = Net()\nm = torch.jit.script(FSDP(net))\n"
    )
    model = build(src)
    m = model.tree.body[-1].targets[0]  # type: ignore[attr-defined]
    assert model.roles.role(m) is Role.MODEL
    assert torch_table.keeps_parameters_method("prepare")
    assert torch_table.shares_parameters("torch.distributed.fsdp.fully_shard")
    assert not torch_table.shares_parameters("copy.deepcopy")
