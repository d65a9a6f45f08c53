"""The shared model's base layer: alias resolution, shadowing, loops, same-file calls."""

from __future__ import annotations

import ast

import pytest

from trainlint.analysis.model import FileModel
from trainlint.source import Source


def build(src: str) -> FileModel:
    return FileModel(ast.parse(src), Source(src))


def call_quals(model: FileModel, name: str) -> list[str | None]:
    return [model.qualname(c.func) for c in model.calls[name]]


@pytest.mark.parametrize(
    ("src", "name", "expected"),
    [
        (
            "import torch.optim as optim\noptim.lr_scheduler.StepLR(o, 3)\n",
            "StepLR",
            "torch.optim.lr_scheduler.StepLR",
        ),
        (
            "from torch.optim import lr_scheduler as sched\nsched.OneCycleLR(o)\n",
            "OneCycleLR",
            "torch.optim.lr_scheduler.OneCycleLR",
        ),
        ("from torch import nn\nnn.Linear(2, 3)\n", "Linear", "torch.nn.Linear"),
        (
            "import torch.nn.functional as F\nF.cross_entropy(a, b)\n",
            "cross_entropy",
            "torch.nn.functional.cross_entropy",
        ),
        (
            "import torch\ntorch.nn.utils.clip_grad.clip_grad_norm_(p, 1)\n",
            "clip_grad_norm_",
            "torch.nn.utils.clip_grad_norm_",
        ),
        ("from ray import remote\nremote(f)\n", "remote", "ray.remote"),
        ("import torch.nn\ntorch.nn.Linear(1, 1)\n", "Linear", "torch.nn.Linear"),
        ("float(x)\n", "float", "builtins.float"),
        (
            "try:\n    import torch\nexcept ImportError:\n    torch = None\ntorch.load(p)\n",
            "load",
            "torch.load",
        ),
    ],
)
def test_alias_resolution(src, name, expected):
    assert call_quals(build(src), name) == [expected]


@pytest.mark.parametrize(
    "src",
    [
        "import torch\ndef f(torch):\n    torch.load(p)\n",
        "import torch\ndef f():\n    torch = Fake()\n    torch.load(p)\n",
        "import torch\nfor torch in things:\n    torch.load(p)\n",
        "import torch\nwith open(p) as torch:\n    torch.load(p)\n",
        "torch.load(p)\n",
        "from torch import load\ndef f(load):\n    load(p)\n",
    ],
)
def test_shadowed_or_unknown_names_stay_unresolved(src):
    model = build(src)
    assert call_quals(model, "load") == [None]


def test_function_import_and_global():
    src = (
        "def f():\n    import torch.optim as o\n    o.SGD(p)\n"
        "def g():\n    global torch\n    torch.load(p)\n"
        "import torch\n"
    )
    model = build(src)
    assert call_quals(model, "SGD") == ["torch.optim.SGD"]
    assert call_quals(model, "load") == ["torch.load"]


def test_class_scope_not_visible_in_methods():
    src = "import torch\nclass A:\n    torch = 1\n    def m(self):\n        torch.load(p)\n"
    assert call_quals(build(src), "load") == ["torch.load"]


def test_loop_contexts_direct_and_through_helpers():
    src = (
        "def inner(b):\n    b.backward()\n"
        "def step(b):\n    inner(b)\n"
        "class T:\n"
        "    def fit(self):\n        for e in range(3):\n            for b in data:\n"
        "                self.one(b)\n"
        "    def one(self, b):\n        step(b)\n"
        "def unused(b):\n    b.backward()\n"
    )
    model = build(src)
    calls = model.calls["backward"]
    inner_bw, unused_bw = calls
    contexts = model.loop_contexts(inner_bw)
    assert len(contexts) == 1
    chain = contexts[0]
    kinds = [type(n).__name__ for n in chain]
    assert kinds == ["Call", "Call", "Call", "For", "For"]
    assert model.loop_contexts(unused_bw) == []
    assert model.in_loop(inner_bw) and not model.in_loop(unused_bw)


def test_enclosing_loops_excludes_iter_and_else():
    src = "for x in f(a.backward()):\n    pass\nelse:\n    b.backward()\n"
    model = build(src)
    assert all(model.enclosing_loops(c) == [] for c in model.calls["backward"])


def test_recursive_helpers_terminate():
    src = "def a(x):\n    b(x)\n    x.backward()\ndef b(x):\n    a(x)\nfor i in r:\n    a(i)\n"
    model = build(src)
    assert model.in_loop(model.calls["backward"][0])
