"""What a parameter holds at its callers (issue 35): the one values-layer answer, its
shapes (positional, keyword, defaults, bound methods, instances, handed-on parameters)
and the cases where it must say "unknown"."""

from __future__ import annotations

import ast
import textwrap

from trainlint.analysis.arguments import (
    argument_at,
    arguments_at_callers,
    arguments_for,
    call_sites,
    default_of,
    escapes_as_value,
    foreign_fact,
    parameter_for,
    passed_at,
    passed_for,
)
from trainlint.analysis.model import FileModel
from trainlint.source import Source


def build(src: str) -> FileModel:
    src = textwrap.dedent(src)
    return FileModel(ast.parse(src), Source(src))


def fn_named(model: FileModel, name: str) -> ast.FunctionDef:
    found = [f for f in model.functions if f.name == name]
    assert len(found) == 1, name
    return found[0]  # type: ignore[return-value]


def texts(exprs: list[ast.expr] | None) -> list[str] | None:
    return None if exprs is None else sorted(ast.unparse(e) for e in exprs)


def test_positional_keyword_and_default() -> None:
    m = build(
        """
        def fit(net, loader, epochs=3):
            pass

        fit(a, b)
        fit(c, loader=d, epochs=5)
        """
    )
    fit = fn_named(m, "fit")
    assert texts(arguments_at_callers(m, fit, "net")) == ["a", "c"]
    assert texts(arguments_at_callers(m, fit, "loader")) == ["b", "d"]
    assert texts(arguments_at_callers(m, fit, "epochs")) == ["3", "5"]
    assert default_of(fit, "epochs") is not None and default_of(fit, "net") is None
    # arguments_for lists only the calls that pass the parameter
    assert [ast.unparse(a) for _, a in arguments_for(m, fit, "epochs")] == ["5"]


def test_bound_methods_skip_the_receiver() -> None:
    m = build(
        """
        class Trainer:
            def __init__(self, net):
                self.net = net

            def step(self, batch, scale=1.0):
                pass

            @staticmethod
            def tidy(batch):
                pass

            def run(self, data):
                self.step(data)
                self.tidy(data)

        t = Trainer(model)
        t.step(other, scale=2.0)
        """
    )
    step = fn_named(m, "step")
    tidy = fn_named(m, "tidy")
    assert texts(arguments_at_callers(m, step, "batch")) is None  # `data`: run's callers unknown
    sites = call_sites(m, step)
    assert len(sites) == 2  # `self.step(...)` and `t.step(...)` on an instance built here
    assert [ast.unparse(argument_at(m, s, step, "batch")) for s in sites] == ["data", "other"]
    (call,) = call_sites(m, tidy)
    assert ast.unparse(argument_at(m, call, tidy, "batch")) == "data"  # static: no receiver
    assert len(call_sites(m, step, instances=False)) == 1


def test_handed_on_parameter_is_followed_up() -> None:
    m = build(
        """
        def inner(net):
            pass

        def middle(net):
            inner(net)

        def outer(model):
            middle(model)

        outer(Net())
        outer(Other())
        """
    )
    inner = fn_named(m, "inner")
    assert texts(arguments_at_callers(m, inner, "net")) == ["Net()", "Other()"]
    assert arguments_at_callers(m, inner, "net", depth=1) is None  # too deep


def test_rebound_parameter_is_not_followed() -> None:
    m = build(
        """
        def inner(net):
            pass

        def outer(model):
            model = wrap(model)
            inner(model)

        outer(Net())
        """
    )
    assert texts(arguments_at_callers(m, fn_named(m, "inner"), "net")) == ["model"]


def test_unknown_cases() -> None:
    m = build(
        """
        def a(x):
            pass

        def b(x):
            pass

        def c(x):
            pass

        def d(x):
            pass

        def loop(x):
            loop(x)

        a(*args)
        b(**opts)
        c()
        handlers = [d]
        d(1)
        """
    )
    for name in ("a", "b", "c", "d", "loop"):
        assert arguments_at_callers(m, fn_named(m, name), "x") is None, name
    assert escapes_as_value(m, fn_named(m, "d"))
    assert arguments_at_callers(m, fn_named(m, "a"), "nope") is None


def test_no_callers_is_empty_not_unknown() -> None:
    m = build("def lonely(x):\n    pass\n")
    assert arguments_at_callers(m, fn_named(m, "lonely"), "x") == []


def test_passed_for_and_at_without_a_definition() -> None:
    call = ast.parse("f(a, *rest, key=b)").body[0].value  # type: ignore[attr-defined]
    assert ast.unparse(passed_for(call, ["x", "y"], "x")) == "a"
    assert passed_for(call, ["x", "y"], "y") is None  # behind a splat
    assert ast.unparse(passed_at(call, -1, "key")) == "b"


def test_foreign_fact_reads_the_view() -> None:
    m = build(
        """
        def train(net):
            pass

        class T:
            def fit(self, opt):
                pass
        """
    )
    assert foreign_fact(m, fn_named(m, "train"), "net") is None  # no project view
    m.project = {"params": {"train": {"net": ["model", "a.Net", None]}, "T.fit": {"opt": ["x"]}}}
    assert foreign_fact(m, fn_named(m, "train"), "net") == ["model", "a.Net", None]
    assert foreign_fact(m, fn_named(m, "fit"), "opt") == ["x"]


def test_constructions_fill_init() -> None:
    m = build(
        """
        class Warmup:
            def __init__(self, opt, steps=10):
                pass

        Warmup(o, 5)
        Warmup(o)
        """
    )
    init = fn_named(m, "__init__")
    assert call_sites(m, init, instances=False) == []
    assert len(call_sites(m, init, constructions=True)) == 2
    assert texts(arguments_at_callers(m, init, "steps")) == ["10", "5"]
    assert texts(arguments_at_callers(m, init, "opt")) == ["o", "o"]


def test_parameter_for_and_inherited_init() -> None:
    m = build(
        """
        class Base:
            def __init__(self, loader, epochs=1):
                pass

        class Child(Base):
            pass

        Child(train_loader, epochs=2)
        """
    )
    init = fn_named(m, "__init__")
    call = m.tree.body[-1].value  # type: ignore[attr-defined]
    assert parameter_for(m, call, init, call.args[0]) == "loader"
    assert parameter_for(m, call, init, call.keywords[0].value) == "epochs"


def test_a_local_of_the_same_name_is_not_the_function() -> None:
    m = build(
        """
        def train(net):
            pass

        def data():
            train = load()
            return train

        train(Net())
        """
    )
    fn = fn_named(m, "train")
    assert not escapes_as_value(m, fn)
    assert texts(arguments_at_callers(m, fn, "net")) == ["Net()"]
