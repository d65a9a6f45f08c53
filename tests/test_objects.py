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


# -- the object-and-uses query ---------------------------------------------------------


def _first_call(model: FileModel, name: str) -> ast.Call:
    return model.calls[name][0]


@pytest.mark.parametrize(
    ("src", "fate"),
    [
        ("s = StepLR(o, 1)\nfor e in range(3):\n    s.step()\n", "called"),
        ("s = StepLR(o, 1)\nprint(s.get_last_lr())\n", "never"),
        ("s = StepLR(o, 1)\nTrainer(s).fit()\n", "escapes"),
        ("def f(sched):\n    sched.step()\ns = StepLR(o, 1)\nf(s)\n", "called"),
        ("def mk():\n    return StepLR(o, 1)\ns = mk()\ns.step()\n", "called"),
        (
            "class T:\n    def __init__(self):\n        self.s = StepLR(o, 1)\n"
            "    def end(self):\n        self.s.step()\n",
            "called",
        ),
        ("s = [StepLR(o, 1)]\n", "escapes"),
    ],
)
def test_fate_follows_the_object_across_functions(src: str, fate: str) -> None:
    from trainlint.analysis.objects import objects

    model = build("from torch.optim.lr_scheduler import StepLR\n" + src)
    assert objects(model).fate(_first_call(model, "StepLR"), "step").value == fate


@pytest.mark.parametrize(
    ("src", "escapes"),
    [
        ("sc = GradScaler()\nsc.step(o)\nif sc is not None:\n    pass\n", False),
        ("sc = GradScaler()\nsc.step(o)\nhelper(sc)\n", True),
        ("sc = GradScaler()\nsc.step(o)\nother = sc or None\n", True),
    ],
)
def test_escapes_is_any_use_but_methods_and_tests(src: str, escapes: bool) -> None:
    from trainlint.analysis.objects import objects

    model = build("from torch.amp import GradScaler\n" + src)
    query = objects(model)
    assert query.escapes(query.of(_first_call(model, "GradScaler"))) is escapes


def test_keys_refers_and_method_calls_through_a_conditional_binding() -> None:
    from trainlint.analysis.objects import objects

    model = build(
        "from torch.utils.data import DistributedSampler\n"
        "s = DistributedSampler(ds) if dist else None\n"
        "def go(x):\n    x.set_epoch(1)\ngo(s)\ns.set_epoch(0)\n"
    )
    query = objects(model)
    obj = query.of(_first_call(model, "DistributedSampler"))
    assert obj.keys
    assert [c.lineno for c in query.method_calls("set_epoch", obj)] == [6]
    go = model.functions[0]
    [(site, arg)] = query.arguments_for(go, "x")
    assert site.lineno == 5 and query.refers(arg, obj)
