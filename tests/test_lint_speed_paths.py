"""The fast paths of a lint run answer exactly as the slow ones they replace."""

from __future__ import annotations

import ast
import gc
import sys
import weakref

import pytest

from trainlint.analysis.model import FileModel
from trainlint.noqa import scan_noqa_comments, tokenize_noqa_comments
from trainlint.plugins import manager
from trainlint.source import Source

TRICKY = [
    'x = "# noqa: TL301"  # noqa: TL302\n',
    "s = '''\n# noqa\n'''  # noqa\n",
    'a = "it\\"s # noqa" # noqa:TL101,TL102\nb = 1\n',
    "f = f'{x!r:>10} # noqa'  # NOQA\n",
    'd = """a \\""" # noqa"""\nc = 2  # see issue # noqa: TL401\n',
    "# trainlint: noqa: TL301\nx = 1  # noqa\n",
    "x = 1  # noqa: TL301\r\ny = 'q # noqa'\r\n",
    "rb'\\' # noqa'  # noqa: X1\n",
]


@pytest.mark.parametrize("text", TRICKY)
def test_noqa_scan_matches_tokenize(text):
    ast.parse(text)
    assert scan_noqa_comments(text) == tokenize_noqa_comments(Source(text))


def test_released_model_is_freed_without_the_cycle_collector():
    text = "import torch\nopt = torch.optim.SGD(model.parameters())\nfor x in d:\n    opt.step()\n"
    model = FileModel(ast.parse(text), Source(text))
    assert model.roles is not None and model.steps.step_loops is not None  # analyses point back
    ref = weakref.ref(model)
    enabled = gc.isenabled()
    gc.disable()
    try:
        model.release()
        del model
        assert ref() is None
    finally:
        if enabled:
            gc.enable()


def test_entry_point_check(tmp_path, monkeypatch):
    site = tmp_path / "site"
    other = site / "other-1.0.dist-info"
    other.mkdir(parents=True)
    # trainlint's own metadata names it outside a [trainlint] section: no plugin
    (other / "entry_points.txt").write_text(
        "[console_scripts]\ntrainlint = trainlint.cli:main\n\n[pytest11]\ntrainlint = x\n"
    )
    monkeypatch.setattr(sys, "path", [str(site)])
    assert not manager.entry_point_plugins_possible()
    plugin = site / "tl_plugin-0.1.dist-info"
    plugin.mkdir()
    (plugin / "entry_points.txt").write_text("[trainlint]\nexample = tl_plugin\n")
    assert manager.entry_point_plugins_possible()


def test_no_plugins_gives_the_builtin_rules_without_pluggy(monkeypatch):
    monkeypatch.setattr(manager, "entry_point_plugins_possible", lambda: False)
    manager._manager.cache_clear()
    try:
        from trainlint.rules import builtin_rules

        assert manager.load_rules(()) == sorted(builtin_rules(), key=lambda r: r.code)
        assert manager.load_formats(()) == {}
    finally:
        manager._manager.cache_clear()
