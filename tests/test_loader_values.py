"""Values the loader rules ask about: the keywords a call receives through a `**opts`
dict literal (call_keywords), the loaders of other libraries, and whether the project
reseeds its distributed samplers anywhere (data_parallel, read from the project view)."""

from __future__ import annotations

import ast

import pytest

from trainlint.analysis.call_keywords import expanded_keywords
from trainlint.analysis.data_parallel import data_facts, project_sets_epoch
from trainlint.analysis.loaders import loader_constructions, true_by_default
from trainlint.analysis.model import FileModel
from trainlint.rules.concurrency.sampler_without_set_epoch import SamplerWithoutSetEpoch
from trainlint.source import Source


def _model(src: str) -> FileModel:
    return FileModel(ast.parse(src), Source(src))


def _keywords(src: str) -> set[str] | None:
    model = _model(src)
    (call,) = loader_constructions(model)
    found = expanded_keywords(model, call)
    return None if found is None else set(found)


def test_a_dict_call_or_display_bound_once_is_expanded() -> None:
    head = "from torch.utils.data import DataLoader\n"
    assert _keywords(
        head + "def f(ds):\n    o = dict(batch_size=8, num_workers=2)\n"
        "    return DataLoader(ds, shuffle=True, **o)\n"
    ) == {"shuffle", "batch_size", "num_workers"}
    assert _keywords(head + "o = {'sampler': s}\nloader = DataLoader(ds, **o)\n") == {"sampler"}


@pytest.mark.parametrize(
    "body",
    [
        "def f(ds, **o):\n    return DataLoader(ds, **o)\n",  # a parameter
        "o = dict(batch_size=8)\no['sampler'] = s\nloader = DataLoader(ds, **o)\n",
        "o = dict(batch_size=8)\no.update(extra)\nloader = DataLoader(ds, **o)\n",
        "o = make_opts()\nloader = DataLoader(ds, **o)\n",  # built by a call
        "o = {**base, 'batch_size': 8}\nloader = DataLoader(ds, **o)\n",
        "if a:\n    o = dict(x=1)\nelse:\n    o = dict(y=2)\nloader = DataLoader(ds, **o)\n",
    ],
)
def test_an_unreadable_star_dict_is_unknown(body: str) -> None:
    assert _keywords("from torch.utils.data import DataLoader\n" + body) is None


def test_library_subclasses_of_the_data_loader_are_loaders() -> None:
    model = _model(
        "from torch_geometric.loader import NeighborLoader\n"
        "from torchdata.stateful_dataloader import StatefulDataLoader\n"
        "a = NeighborLoader(g, num_neighbors=[5], shuffle=True)\n"
        "b = StatefulDataLoader(ds)\n"
        "c = MyLoader(ds)\n"
    )
    assert len(loader_constructions(model)) == 2


RETURNED = """
from torch.utils.data import DataLoader, DistributedSampler

def build(ds, rank, world):
    return DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds, world, rank))
"""


def _tl504(src: str, view: dict | None) -> list[int]:
    model = _model(src)
    model.project_data = view.get("data") if view else None
    return [r.node.lineno for r in SamplerWithoutSetEpoch().check(model)]


def test_a_sampler_that_leaves_the_file_is_judged_by_the_project() -> None:
    assert data_facts(_model(RETURNED)) == {"samples": True, "loads": True}
    # no view (the file alone) and a project that reseeds somewhere: silent
    assert _tl504(RETURNED, None) == []
    assert _tl504(RETURNED, {"data": ["sets"]}) == []
    assert _tl504(RETURNED, {"data": []}) == [5]
    assert project_sets_epoch(_model(RETURNED)) is None


def test_a_loader_iterated_once_here_is_not_judged_by_the_project() -> None:
    single_pass = RETURNED + (
        "\nloader = build(ds, 0, 1)\n"
        "for x in loader:\n"
        "    opt.zero_grad()\n"
        "    model(x).sum().backward()\n"
        "    opt.step()\n"
    )
    assert _tl504(single_pass, {"data": []}) == []


def test_a_file_that_reseeds_says_so() -> None:
    src = "def each_epoch(loader, epoch):\n    loader.sampler.set_epoch(epoch)\n"
    assert data_facts(_model(src)) == {"sets": True}


def test_a_held_out_split_leaving_the_file_is_not_judged_by_the_project() -> None:
    for held_out in (
        RETURNED.replace("DistributedSampler(ds,", "DistributedSampler(val_ds,"),
        RETURNED.replace("batch_size=8,", "batch_size=8, shuffle=False,"),
    ):
        assert _tl504(held_out, {"data": []}) == []


@pytest.mark.parametrize(
    ("signature", "expected"),
    [
        ("fixed=False", True),
        ("fixed=None", True),
        ("*, fixed=False", True),
        ("fixed=True", False),
        ("fixed", False),  # no default: the callers decide
    ],
)
def test_a_negated_parameter_is_judged_by_its_default(signature: str, expected: bool) -> None:
    model = _model(f"def load(ds, {signature}):\n    return DataLoader(ds, shuffle=not fixed)\n")
    (call,) = [n for n in ast.walk(model.tree) if isinstance(n, ast.Call)]
    assert true_by_default(model, call.keywords[0].value) is expected


def test_a_rebound_parameter_is_not_its_default() -> None:
    model = _model(
        "def load(ds, fixed=False):\n    fixed = cfg.fixed\n"
        "    return DataLoader(ds, shuffle=not fixed)\n"
    )
    call = next(n for n in ast.walk(model.tree) if isinstance(n, ast.Call) and n.keywords)
    assert not true_by_default(model, call.keywords[0].value)
