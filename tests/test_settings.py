"""Settings across files: the project's default for `cfg.warmup_epochs`, decided only when
nothing in the project can change it (analysis.settings)."""

from __future__ import annotations

import ast

import pytest

from trainlint.analysis import settings
from trainlint.analysis.constants import NONNEG, POS, ConstantEvaluator
from trainlint.analysis.model import FileModel
from trainlint.source import Source

CONFIG = """
from dataclasses import dataclass, field

@dataclass
class TrainConfig:
    epochs: int = 90
    warmup_epochs: int = 5
    milestones: list = field(default_factory=list)
    name: str = "run"
"""


def decided(*sources: str) -> dict:
    return settings.merge(settings.summary(ast.parse(s)) for s in sources)


def test_dataclass_default_is_the_setting_when_nothing_changes_it():
    got = decided(CONFIG, "cfg = TrainConfig()\nprint(cfg.warmup_epochs)\n")
    assert got["warmup_epochs"] == 5 and got["epochs"] == 90
    assert "milestones" not in got and "name" not in got  # not numbers


@pytest.mark.parametrize(
    "other",
    [
        "cfg = TrainConfig(warmup_epochs=args.warmup)\n",  # a keyword at construction
        "cfg = TrainConfig()\ncfg.warmup_epochs = 0\n",  # an attribute store
        "p.add_argument('--warmup-epochs', type=int, default=5)\n",  # the command line
        "cfg = TrainConfig(**yaml.safe_load(f))\n",  # a splat of a loaded file
        "cfg = HfArgumentParser(TrainConfig).parse_args_into_dataclasses()[0]\n",
        "for k, v in overrides.items():\n    setattr(cfg, k, v)\n",  # computed names
        "cfg.__dict__.update(loaded)\n",
    ],
)
def test_anything_that_can_change_it_leaves_it_undecided(other):
    assert "warmup_epochs" not in decided(CONFIG, other)


def test_plain_class_init_namespace_and_dict_literals():
    src = """
from types import SimpleNamespace

class Opts:
    def __init__(self, warmup_steps=500):
        self.warmup_steps = warmup_steps
        self.total = 10

HP = SimpleNamespace(warmup_iters=200)
CONFIG = {"warmup_updates": 0}
"""
    got = decided(src)
    assert got == {"warmup_steps": 500, "total": 10, "warmup_iters": 200, "warmup_updates": 0}


def test_different_positive_defaults_are_positive_and_mixed_ones_undecided():
    a = "class A:\n    warmup = 3\n"
    assert decided(a, "class B:\n    warmup = 7\n")["warmup"] == settings.POSITIVE
    assert "warmup" not in decided(a, "class B:\n    warmup = 0\n")


def test_the_evaluator_reads_the_view_for_settings_the_file_does_not_declare():
    src = "def f(step):\n    return step / cfg.warmup_epochs + CONFIG['k'] + cfg.other\n"
    model = FileModel(ast.parse(src), Source(src))
    model.project = {"settings": {"warmup_epochs": 5, "k": settings.POSITIVE}}
    ev = ConstantEvaluator(model)
    nodes = {
        getattr(n, "attr", "key"): n
        for n in ast.walk(model.tree)
        if isinstance(n, (ast.Attribute, ast.Subscript))
    }
    attr, key, other = nodes["warmup_epochs"], nodes["key"], nodes["other"]
    assert ev.expr(attr, {}) == 5
    assert ev.expr(key, {}) is POS
    assert ev.expr(other, {}) is NONNEG


def test_view_gives_a_file_only_the_settings_it_reads():
    joined = settings.ProjectSettings()
    joined.add(settings.summary(ast.parse(CONFIG)))
    reader = settings.summary(ast.parse("s = LambdaLR(opt, lambda e: e / cfg.warmup_epochs)\n"))
    assert joined.view(reader) == {"settings": {"warmup_epochs": 5}}
    # a file that evaluates no schedule is given nothing: its view stays as it was
    assert joined.view(settings.summary(ast.parse("x = cfg.warmup_epochs\n"))) == {}


def test_a_classmethod_building_from_a_splat_opens_its_class():
    src = (
        CONFIG + "\n    @classmethod\n    def load(cls, path):\n        return cls(**read(path))\n"
    )
    assert "warmup_epochs" not in decided(src)


def test_constructor_arguments_every_call_site_agrees_on():
    joined = settings.ProjectSettings()
    lib = (
        "class WarmupDecay:\n    def __init__(self, opt, warmup, start_step):\n"
        "        opt.param_groups[0]['lr'] = 0.1\n"
    )
    joined.add(settings.summary(ast.parse(lib)))
    caller = "def build(opt):\n    first = 0\n    return WarmupDecay(opt, 100, start_step=first)\n"
    joined.add(settings.summary(ast.parse(caller)))
    view = joined.view(settings.summary(ast.parse(lib)))
    assert view["arguments"] == {"WarmupDecay": {"1": 100, "start_step": 0}}
    joined.add(settings.summary(ast.parse("s = WarmupDecay(o, 100, start_step=resume_at)\n")))
    assert joined.view(settings.summary(ast.parse(lib)))["arguments"] == {"WarmupDecay": {"1": 100}}
    joined.add(settings.summary(ast.parse("s = WarmupDecay(*args)\n")))
    assert "arguments" not in joined.view(settings.summary(ast.parse(lib)))


def test_the_model_tables_give_the_summary_the_walk_gives():
    src = CONFIG + (
        "\n\nclass Opts:\n    def __init__(self, warmup_steps=500):\n"
        "        self.warmup_steps = warmup_steps\n\n"
        "HP = SimpleNamespace(warmup_iters=200)\n"
        "def build(opt, args):\n    first = 0\n"
        "    cfg = TrainConfig(epochs=args.epochs)\n    cfg.name = 'x'\n"
        "    cfg.update({'k': 1})\n    p.add_argument('--lr-steps', default=3)\n"
        "    return LambdaLR(opt, lambda e: e / cfg.warmup_epochs), Sched(opt, 7, start=first)\n"
    )
    tree = ast.parse(src)
    walked = settings.summary(tree)
    tabled = settings.summary(tree, FileModel(tree, Source(src)), src)
    assert walked == tabled
    assert walked is not None and walked["passed"]["Sched"] == [{"0": None, "1": 7, "start": 0}]
