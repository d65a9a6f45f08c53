"""Where a loader goes in a file (reaching_keys) and which parts of an expression decide
its values (content_nodes)."""

from __future__ import annotations

import ast

from trainlint.analysis.loaders import DATA_LOADER, content_nodes, reaching_keys
from trainlint.analysis.model import FileModel
from trainlint.source import Source


def _model(src: str) -> FileModel:
    return FileModel(ast.parse(src), Source(src))


FACTORY = """
from torch.utils.data import DataLoader

class Runner:
    def __init__(self, net, loader):
        self.loader = loader

def build():
    a = DataLoader(ds, shuffle=True)
    b = DataLoader(ds)
    return a, b

first, second = build()
runner = Runner(None, first)
"""


def test_reaches_caller_tuple_position_constructor_param_and_attribute() -> None:
    model = _model(FACTORY)
    a, b = model.calls_to(DATA_LOADER)
    names = {k[-1] for k in reaching_keys(model, a)}
    assert names == {"a", "first", "loader"}
    assert ("attr", id(model.class_named("Runner")), "loader") in reaching_keys(model, a)
    assert {k[-1] for k in reaching_keys(model, b)} == {"b", "second"}


def test_not_followed_into_calls_of_other_files() -> None:
    model = _model("from torch.utils.data import DataLoader\nx = DataLoader(ds)\nwrap(x)\n")
    (call,) = model.calls_to(DATA_LOADER)
    assert {k[-1] for k in reaching_keys(model, call)} == {"x"}


def test_device_argument_is_not_content() -> None:
    model = _model("y = table.to(device)\nz = rows[rank].cuda(rank)\n")
    first, second = (stmt.value for stmt in model.tree.body)  # type: ignore[attr-defined]
    assert {n.id for n in content_nodes(model, first) if isinstance(n, ast.Name)} == {"table"}
    assert {n.id for n in content_nodes(model, second) if isinstance(n, ast.Name)} == {
        "rows",
        "rank",
    }


def test_dict_entry_follows_the_dict_by_keyword_into_an_attribute() -> None:
    model = _model(
        "from torch.utils.data import DataLoader\n"
        "class T:\n"
        "    def __init__(self, loaders):\n"
        "        self.loaders = loaders\n"
        "d = {'train': DataLoader(a), 'dev': DataLoader(b)}\n"
        "T(loaders=d)\n"
    )
    train, dev = model.calls_to(DATA_LOADER)
    cls = model.class_named("T")
    assert ("item", ("attr", id(cls), "loaders"), "train") in reaching_keys(model, train)
    assert all(k[-1] == "dev" for k in reaching_keys(model, dev))
