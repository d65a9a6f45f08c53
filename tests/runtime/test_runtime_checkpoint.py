"""Runtime confirmation of TL704 checkpoint-needs-pickle, on the installed torch.

A checkpoint that holds an `argparse.Namespace` (the command line saved next to the
weights) is written with a real `torch.save`. The bare `torch.load` TL704 reports raises
`UnpicklingError` on torch 2.6 and later, where `weights_only` defaults to True; the fix
TL704 offers (`weights_only=False`) loads it on every torch; and the advice of saving
plain data (`vars(args)`, state dicts) loads with the default too.
"""

from __future__ import annotations

import argparse

import pytest

torch = pytest.importorskip("torch")

WEIGHTS_ONLY_DEFAULT = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 6)


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=3)
    return parser.parse_args([])


def _save(tmp_path, args_value):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = tmp_path / "last.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "epoch": 2,
            "args": args_value,
        },
        path,
    )
    return path


@pytest.mark.skipif(not WEIGHTS_ONLY_DEFAULT, reason="weights_only defaults to True from torch 2.6")
def test_bare_load_of_a_namespace_checkpoint_fails(tmp_path):
    path = _save(tmp_path, _args())
    with pytest.raises(torch.serialization.pickle.UnpicklingError, match="Namespace"):
        torch.load(path)  # what TL704 reports


def test_weights_only_false_loads_it(tmp_path):
    path = _save(tmp_path, _args())
    ckpt = torch.load(path, weights_only=False)  # TL704's fix
    assert ckpt["args"].epochs == 3 and ckpt["epoch"] == 2


def test_plain_data_loads_with_the_default(tmp_path):
    path = _save(tmp_path, vars(_args()))  # TL704's advice: save `vars(args)`
    ckpt = torch.load(path)
    assert ckpt["args"] == {"lr": 0.1, "epochs": 3}


def test_the_linter_reports_the_failing_load(tmp_path):
    """The same save/load pair, linted: TL704 at the bare load, with the fix that works."""
    from trainlint import lint_source

    source = (
        "import argparse\nimport torch\n\n"
        "args = argparse.ArgumentParser().parse_args()\n"
        "torch.save({'model': {}, 'args': args}, 'last.pt')\n"
        "ckpt = torch.load('last.pt')\n"
    )
    (finding,) = [f for f in lint_source(source, select=["TL704"])]
    assert finding.line == 6 and "argparse.Namespace" in finding.message
    assert finding.fix is not None and "weights_only=False" in finding.fix.edits[0].content
