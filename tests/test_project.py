"""The project index: module names, summaries, views, and the cache's cross-file keys."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainlint.runner as runner
import trainlint.workers as workers
from trainlint.analysis.project import (
    ProjectIndex,
    absolute,
    digest,
    import_graph,
    import_order,
    module_of,
)
from trainlint.cache import Cache
from trainlint.config import Settings, select_rules
from trainlint.rules import builtin_rules

ALL = select_rules(builtin_rules(), Settings())

TRAINER = """import torch


class Trainer:
    def __init__(self, model, optimizer, scheduler, loader):
        self.model, self.optimizer = model, optimizer
        self.scheduler = scheduler
        self.loader = loader

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                self.model(x).sum().backward()
                self.optimizer.step()
                self.scheduler.step()
"""
MAIN = """import torch
from torch.optim import lr_scheduler

from .trainer import Trainer


def main(model, loader):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = lr_scheduler.{sched}
    Trainer(model, opt, sched, loader).fit(90)
"""
STEPLR = "StepLR(opt, step_size=30)"
ONECYCLE = "OneCycleLR(opt, max_lr=0.1, total_steps=90 * len(loader))"
UNRELATED = "import torch\n\n\ndef helper(x):\n    return torch.relu(x)\n"


def test_module_names(tmp_path):
    pkg = tmp_path / "pkg" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("")
    (tmp_path / "script.py").write_text("")
    assert module_of(pkg / "mod.py") == (str(tmp_path), "pkg.sub.mod", False)
    assert module_of(pkg / "__init__.py") == (str(tmp_path), "pkg.sub", True)
    assert module_of(tmp_path / "script.py") == (str(tmp_path), "script", False)


@pytest.mark.parametrize(
    ("raw", "module", "pkg", "want"),
    [
        (".sched.make", "pkg.train", False, "pkg.sched.make"),
        ("..util.f", "pkg.sub.train", False, "pkg.util.f"),
        (".models", "pkg", True, "pkg.models"),
        ("torch.nn", "pkg.train", False, "torch.nn"),
    ],
)
def test_relative_imports_made_absolute(raw, module, pkg, want):
    assert absolute(raw, module, pkg) == want


def _summary(module, **kw):
    base = {
        "root": "/r",
        "module": module,
        "pkg": False,
        "imports": {},
        "stars": [],
        "exported": {},
        "defs": [],
        "functions": {},
        "classes": {},
        "calls": [],
    }
    base.update(kw)
    return base


def test_reexport_and_star_resolution():
    sched = ["scheduler", "StepLR", "epoch", False]
    index = ProjectIndex(
        [
            _summary(
                "pkg.factory",
                defs=["make"],
                functions={"make": {"params": ["opt"], "returns": sched}},
            ),
            _summary("pkg", imports={"make": [".factory.make", "pkg.factory.make"]}),
            _summary("pkg.common", stars=["pkg.factory"], exported={"torch": "torch"}),
            _summary("pkg.train", imports={"make": ["pkg.make", "pkg.make"]}, stars=["pkg.common"]),
        ]
    )
    assert index.resolve("/r", "pkg.make")[1] == "make"  # through the __init__ re-export
    view = index.view("/r", "pkg.train")
    assert view is not None
    assert view["refs"]["pkg.make"] == sched
    assert view["stars"]["torch"] == "torch"  # a star import of a star import
    assert index.view("/r", "pkg.factory") is None


def test_call_sites_give_parameter_facts_and_disagreement_drops_the_unit():
    epoch = ["scheduler", "StepLR", "epoch", False]
    it = ["scheduler", "OneCycleLR", "iteration", False]
    callee = _summary("m.engine", defs=["run"], functions={"run": {"params": ["model", "sched"]}})
    one = ProjectIndex([callee, _summary("m.a", calls=[["m.engine.run", [[1, epoch]]]])])
    assert one.view("/r", "m.engine")["params"] == {"run": {"sched": epoch}}
    two = ProjectIndex(
        [
            callee,
            _summary("m.a", calls=[["m.engine.run", [[1, epoch]]]]),
            _summary("m.b", calls=[["m.engine.run", [["sched", it]]]]),
        ]
    )
    assert two.view("/r", "m.engine")["params"]["run"]["sched"][2] is None
    assert digest(None) == ""


@pytest.fixture
def project(tmp_path):
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(TRAINER)
    (pkg / "main.py").write_text(MAIN.format(sched=STEPLR))
    (pkg / "unrelated.py").write_text(UNRELATED)
    return pkg


def _run(pkg: Path, cache: Cache, monkeypatch) -> tuple[list, list[str]]:
    linted: list[str] = []
    real = workers._work

    def counting(item):
        path = item if isinstance(item, Path) else item[0]
        linted.append(path.name)
        return real(item)

    monkeypatch.setattr(workers, "_work", counting)
    files = sorted(pkg.glob("*.py"))
    result = runner.run(files, ALL, Settings(), jobs=1, cache=cache)
    monkeypatch.setattr(workers, "_work", real)
    return [(Path(f.path).name, f.line, f.code) for f in result.findings], sorted(linted)


def test_cache_relints_a_file_and_its_dependents_only(project, tmp_path, monkeypatch):
    cache = Cache(tmp_path / "cache", "test")
    found, linted = _run(project, cache, monkeypatch)
    assert found == [("trainer.py", 16, "TL201")]
    # cold: every file once, the trainer again with its view
    assert linted == ["__init__.py", "main.py", "trainer.py", "trainer.py", "unrelated.py"]
    found, linted = _run(project, cache, monkeypatch)
    assert found == [("trainer.py", 16, "TL201")] and linted == []
    # an edit that changes nothing another file sees: that file only
    (project / "main.py").write_text(MAIN.format(sched=STEPLR) + "# a comment\n")
    found, linted = _run(project, cache, monkeypatch)
    assert found == [("trainer.py", 16, "TL201")] and linted == ["main.py"]
    # the scheduler built in main.py changes: main.py and the trainer, not the rest
    (project / "main.py").write_text(MAIN.format(sched=ONECYCLE))
    found, linted = _run(project, cache, monkeypatch)
    assert found == [] and linted == ["main.py", "trainer.py"]
    # editing the trainer re-lints the trainer alone, once: main.py's cached summary
    # already gives it its whole view (the scheduler main.py passes)
    (project / "trainer.py").write_text(TRAINER + "\n")
    found, linted = _run(project, cache, monkeypatch)
    assert found == [] and linted == ["trainer.py"]


def test_fix_runs_need_no_index(project):
    from trainlint.runner import FixMode

    result = runner.run(
        sorted(project.glob("*.py")), ALL, Settings(), jobs=1, fix=FixMode(diff=True)
    )
    assert result.errors == []


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "projects"


def test_fix_runs_see_the_findings_of_check(tmp_path):
    """A finding that needs another file (TL202: the optimizer steps in engine.py) is
    found, and fixed, by `--diff`/`--fix` as by `check`."""
    import shutil

    from trainlint.runner import FixMode

    pkg = tmp_path / "xfile_sched_order_pos"
    shutil.copytree(FIXTURES / "xfile_sched_order_pos", pkg)
    files = sorted(pkg.glob("*.py"))
    checked = runner.run(files, ALL, Settings(), jobs=1)
    assert [(Path(f.path).name, f.code) for f in checked.findings] == [("main.py", "TL202")]
    diffed = runner.run(files, ALL, Settings(), jobs=1, fix=FixMode(diff=True))
    assert diffed.errors == [] and len(diffed.diffs) == 1
    assert "+            train_step(model, optimizer, batch)" in diffed.diffs[0]
    fixed = runner.run(files, ALL, Settings(), jobs=1, fix=FixMode(write=True))
    assert fixed.fixed == 1
    body = (pkg / "main.py").read_text().splitlines()
    assert body[-2:] == [
        "            train_step(model, optimizer, batch)",
        "            scheduler.step()  # expect: TL202",
    ]
    assert runner.run(files, ALL, Settings(), jobs=1).findings == []


ENGINE = """import torch

from .util import clear


def train_step(model, optimizer, batch):
    model(batch).sum().backward()
    optimizer.step()
    clear(optimizer)
"""
UTIL_ZERO = "import torch\n\n\ndef clear(opt):\n    opt.zero_grad()\n"
UTIL_NONE = "import torch\n\n\ndef clear(opt):\n    return opt\n"
LOOP = """import torch

from .engine import train_step


def main(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for batch in loader:
        train_step(model, optimizer, batch)
        optimizer.step()
"""


def test_effects_follow_calls_across_files_transitively(tmp_path, monkeypatch):
    """main -> engine.train_step -> util.clear: the zero_grad two files away reaches the
    loop in main.py (TL105-style orders need it), with the argument mapped at each call;
    editing util.py re-lints main.py, whose view holds util's effect."""
    pkg = tmp_path / "chain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text(ENGINE)
    (pkg / "util.py").write_text(UTIL_ZERO)
    (pkg / "main.py").write_text(LOOP)
    from trainlint.analysis.project import view_of_file

    entry = view_of_file(str(pkg / "main.py"), __import__("ast").parse(LOOP))["calls"][
        ".engine.train_step"
    ]
    assert entry["fn"] == "chain.engine.train_step"
    assert entry["paths"] == [
        [
            ["BACKWARD", None, 0, 0],
            ["STEP", ["p", "optimizer", ""], 0, 0],
            ["ZERO", ["p", "optimizer", ""], 0, 0],
        ]
    ]
    cache = Cache(tmp_path / "cache", "test")
    _run(pkg, cache, monkeypatch)
    (pkg / "util.py").write_text(UTIL_NONE)
    _, linted = _run(pkg, cache, monkeypatch)
    assert "main.py" in linted and "engine.py" in linted


def test_cycles_across_files_are_cut(tmp_path):
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "import torch\nfrom .b import g\n\n\ndef f(opt):\n    opt.zero_grad()\n    g(opt)\n"
    )
    (pkg / "b.py").write_text(
        "import torch\nfrom .a import f\n\n\ndef g(opt):\n    opt.step()\n    f(opt)\n"
    )
    main = "import torch\nfrom .a import f\n\nfor x in loader:\n    x.backward()\n    f(o)\n"
    (pkg / "main.py").write_text(main)
    from trainlint.analysis.project import view_of_file

    entry = view_of_file(str(pkg / "main.py"), __import__("ast").parse(main))["calls"][".a.f"]
    kinds = [[e[0] for e in p] for p in entry["paths"]]
    assert kinds == [["ZERO", "STEP"]]  # a -> b -> (a again: cut)
    result = runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=1)
    assert result.errors == []


def test_ambiguous_or_dynamic_calls_stay_silent(tmp_path):
    """A method called on something the file cannot tie to one class, a callee whose
    paths were cut: no events, no findings."""
    pkg = tmp_path / "amb"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(
        "import torch\n\n\nclass Stepper:\n    def run(self, opt):\n        opt.step()\n"
    )
    main = (
        "import torch\nfrom .helpers import Stepper\n\n\ndef main(loader, opt, flag):\n"
        "    s = Stepper() if flag else None\n    for x in loader:\n"
        "        sched.step()\n        s.run(opt)\n"
    )
    (pkg / "main.py").write_text(main)
    result = runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=1)
    assert result.findings == [] and result.errors == []


def test_a_method_of_an_instance_built_once_is_followed(tmp_path):
    pkg = tmp_path / "meth"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text(
        "import torch\n\n\nclass Stepper:\n"
        "    def run(self, loss, opt):\n        loss.backward()\n"
        "        opt.step()\n        opt.zero_grad()\n"
    )
    main = (
        "import torch\nfrom torch.optim.lr_scheduler import OneCycleLR\n"
        "from .helpers import Stepper\n\n\ndef main(model, loader, opt):\n"
        "    sched = OneCycleLR(opt, max_lr=0.1, total_steps=len(loader))\n"
        "    s = Stepper()\n    for x in loader:\n"
        "        sched.step()\n        s.run(model(x).sum(), opt)\n"
    )
    (pkg / "main.py").write_text(main)
    result = runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=1)
    assert [(Path(f.path).name, f.line, f.code) for f in result.findings] == [
        ("main.py", 10, "TL202")
    ]


KW_TRAINER = """import torch


class Trainer:
    def __init__(self, model, optimizer, loader, **kwargs):
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.scheduler = kwargs["scheduler"]

    def fit(self, epochs):
        for epoch in range(epochs):
            for x, y in self.loader:
                self.optimizer.zero_grad()
                torch.nn.functional.cross_entropy(self.model(x), y).backward()
                self.optimizer.step()
                self.scheduler.step()
"""
KW_MAIN = """import torch
from torch.optim.lr_scheduler import StepLR

from .trainer import Trainer


def main(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Trainer(model, optimizer, loader, scheduler=StepLR(optimizer, step_size=30)).fit(90)
"""


@pytest.fixture
def kwargs_project(tmp_path):
    pkg = tmp_path / "kw"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(KW_TRAINER)
    (pkg / "main.py").write_text(KW_MAIN)
    return pkg


def test_keywords_into_kwargs_reach_the_constructor(kwargs_project):
    """`Trainer(scheduler=StepLR(...))` into `**kwargs`: the index keeps the fact as
    `kwargs["scheduler"]`, and `kwargs["scheduler"]` / `kwargs.get("scheduler")` in the
    constructor read it (analysis.project.foreign_binding)."""
    import ast

    from trainlint.analysis.model import FileModel
    from trainlint.analysis.project import apply_view, foreign_binding, summarize
    from trainlint.source import Source

    summaries = []
    for name in ("trainer.py", "main.py"):
        path = kwargs_project / name
        text = path.read_text()
        model = FileModel(ast.parse(text), Source(text), str(path))
        summaries.append(summarize(model, model.tree, module_of(path)))
    root, module, _ = module_of(kwargs_project / "trainer.py")
    view = ProjectIndex(summaries).view(root, module)
    assert view["params"]["Trainer.__init__"]['kwargs["scheduler"]'] == [
        "scheduler",
        "StepLR",
        "epoch",
        False,
    ]
    for spelling in ('kwargs["scheduler"]', 'kwargs.get("scheduler")'):
        text = KW_TRAINER.replace('kwargs["scheduler"]', spelling)
        model = FileModel(ast.parse(text), Source(text), "trainer.py")
        apply_view(model, view)
        value = next(
            n.value
            for n in ast.walk(model.tree)
            if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "self.scheduler"
        )
        binding = foreign_binding(model, value)
        assert binding is not None and binding.cls == "StepLR", spelling


@pytest.mark.parametrize("spelling", ['kwargs["scheduler"]', 'kwargs.get("scheduler")'])
def test_a_scheduler_passed_through_kwargs_is_judged_by_its_unit(kwargs_project, spelling):
    trainer = kwargs_project / "trainer.py"
    trainer.write_text(KW_TRAINER.replace('kwargs["scheduler"]', spelling))
    result = runner.run(sorted(kwargs_project.glob("*.py")), ALL, Settings(), jobs=1)
    assert [(Path(f.path).name, f.code) for f in result.findings] == [("trainer.py", "TL201")]
    # the same trainer handed a per-iteration schedule is right
    main = kwargs_project / "main.py"
    main.write_text(
        KW_MAIN.replace(
            "StepLR(optimizer, step_size=30)", "OneCycleLR(optimizer, max_lr=0.1, total_steps=9000)"
        ).replace("import StepLR", "import OneCycleLR")
    )
    result = runner.run(sorted(kwargs_project.glob("*.py")), ALL, Settings(), jobs=1)
    assert result.findings == []


def test_a_method_of_an_attribute_built_once_in_the_class_is_followed(tmp_path):
    pkg = tmp_path / "attr"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "evaluation.py").write_text(
        "import torch\n\n\nclass Evaluator:\n"
        "    def run(self, model):\n        model.eval()\n"
        "        return 0.0\n"
    )
    main = """import torch

from .evaluation import Evaluator


class Trainer:
    def __init__(self, model, loader):
        self.model, self.loader = model, loader
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        self.evaluator = Evaluator()

    def fit(self, epochs):
        for epoch in range(epochs):
            for x in self.loader:
                self.optimizer.zero_grad()
                self.model(x).sum().backward()
                self.optimizer.step()
            self.evaluator.run(self.model)
"""
    (pkg / "main.py").write_text(main)
    result = runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=1)
    assert [(Path(f.path).name, f.line, f.code) for f in result.findings] == [
        ("main.py", 18, "TL701")
    ]


def test_an_order_inside_another_files_step_function_is_reported_there_only(tmp_path):
    pkg = tmp_path / "dup"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text(
        "import torch\n\n\ndef train_step(model, optimizer, scheduler, batch):\n"
        "    optimizer.zero_grad()\n    model(batch).sum().backward()\n"
        "    scheduler.step()\n    optimizer.step()\n"
    )
    (pkg / "main.py").write_text(
        "import torch\n\nfrom .engine import train_step\n\n\n"
        "def main(model, loader, optimizer, scheduler):\n    for batch in loader:\n"
        "        train_step(model, optimizer, scheduler, batch)\n"
    )
    result = runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=1)
    assert [(Path(f.path).name, f.line, f.code) for f in result.findings] == [
        ("engine.py", 7, "TL202")
    ]


@pytest.mark.parametrize("spelling", ["t = ctx.training", "direct"])
def test_a_scheduler_reached_through_an_attribute_chain_is_judged_by_its_unit(tmp_path, spelling):
    """`Context(Training(net, opt, StepLR(...)))` built in main.py, stepped in engine.py
    as `t.scheduler` (`t = ctx.training`) or `ctx.training.scheduler`: the view carries
    the attribute facts of the classes `ctx` is an instance of (analysis.project)."""
    import shutil

    pkg = tmp_path / "chain"
    shutil.copytree(FIXTURES / "ctx_chain_sched_pos", pkg)
    engine = pkg / "engine.py"
    if spelling == "direct":
        engine.write_text(
            engine.read_text().replace("    t = ctx.training\n", "").replace("t.", "ctx.training.")
        )
    files = sorted(pkg.glob("*.py"))
    found = runner.run(files, ALL, Settings(), jobs=1).findings
    assert [(Path(f.path).name, f.code, f.line) for f in found] == [
        ("engine.py", "TL201", 9 if spelling == "direct" else 10)
    ]
    main = pkg / "main.py"
    text = main.read_text()
    # a second call site handing the same constructor another schedule: facts conflict
    main.write_text(
        text + "\n\ndef other(loader):\n    net = nn.Linear(8, 1)\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    ctx = Context(Training(net, opt, torch.optim.lr_scheduler.OneCycleLR(\n"
        "        opt, max_lr=0.1, total_steps=len(loader))))\n"
        "    train_one_epoch(ctx, loader)\n"
    )
    assert runner.run(files, ALL, Settings(), jobs=1).findings == []
    # the link rebound in engine.py: nothing is known of it any more
    main.write_text(text)
    engine.write_text(
        engine.read_text().replace(
            "    for x, y", "    ctx.training = ctx.fresh()\n    for x, y", 1
        )
    )
    assert runner.run(files, ALL, Settings(), jobs=1).findings == []
    # the neg twin: a per-iteration schedule stepped per batch is right
    shutil.rmtree(pkg)
    shutil.copytree(FIXTURES / "ctx_chain_sched_neg", pkg)
    assert runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=1).findings == []


def test_a_summary_written_by_another_build_is_not_served(tmp_path):
    # what a summary holds grows with the analysis (effects, kept parameters, class
    # attributes); one cached by an older checkout of the same version would hide them
    module = (str(tmp_path), "pkg.engine", False)
    old = Cache(tmp_path / "cache", "config", code="build-1")
    old.put_summary("abc", module, {"functions": {}})
    assert old.get_summary("abc", module) == {"functions": {}}
    assert Cache(tmp_path / "cache", "config", code="build-2").get_summary("abc", module) is None
    # the configuration is no part of a summary's key
    assert Cache(tmp_path / "cache", "other", code="build-1").get_summary("abc", module) == {
        "functions": {}
    }


ONE_FILE = """import torch
from torch.optim.lr_scheduler import StepLR


def train_one_epoch(model, loader, optimizer, scheduler):
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()


def main(model, loader, epochs=90):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = StepLR(optimizer, step_size=30)
    for epoch in range(epochs):
        train_one_epoch(model, loader, optimizer, scheduler)
"""
OTHER_CALLER = """import torch
from torch.optim.lr_scheduler import OneCycleLR

from .script import train_one_epoch


def finetune(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_one_epoch(model, loader, optimizer, OneCycleLR(optimizer, 0.1, total_steps=9))
"""


def test_a_view_the_file_gives_itself_needs_no_second_lint(tmp_path, monkeypatch):
    # The scheduler's unit reaches the helper's parameter from the file's own call site:
    # the first lint already has it, and the run keeps that lint.
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "script.py").write_text(ONE_FILE)
    found, linted = _run(pkg, None, monkeypatch)
    assert found == [("script.py", 11, "TL201")]
    assert linted == ["__init__.py", "script.py"]
    # Another file passes an iteration-unit scheduler: the call sites disagree, the
    # whole view differs from the one the file was linted with, the file is linted
    # again and is silent. The caller is linted once: it comes after the file it
    # imports, whose step effects (its view) are known by then.
    (pkg / "other.py").write_text(OTHER_CALLER)
    found, linted = _run(pkg, None, monkeypatch)
    assert found == []
    assert linted == ["__init__.py", "other.py", "script.py", "script.py"]


def test_files_are_linted_after_the_files_they_import(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("from pkg import b\nfrom .c import thing\nimport d as dd, os\n")
    files = [
        (tmp_path / n, ("/r", m, False))
        for n, m in [("a.py", "pkg.a"), ("b.py", "pkg.b"), ("c.py", "pkg.c"), ("d.py", "d")]
    ]
    (tmp_path / "b.py").write_text("import pkg.a\n")  # a cycle: cut where it closes
    (tmp_path / "c.py").write_text("x = 1\n")
    (tmp_path / "d.py").write_text("from pkg.c import x\n")
    order = [
        files[k][1][1]
        for k in import_order(list(map(list, import_graph(files, lambda p: p.read_bytes()))))
    ]
    # a's imports, each after its own (d after c); b, which imports a back, before a
    assert order == ["pkg.c", "d", "pkg.b", "pkg.a"]


def _summaries(files: list[Path], cache: Cache) -> dict[str, dict]:
    from trainlint.cache import content_hash

    return {
        p.name: cache.get_summary(content_hash(p.read_bytes()), module_of(p))  # type: ignore[arg-type]
        for p in files
    }


def test_what_no_other_file_imports_is_summarised_lean(tmp_path):
    """What only a caller in another file reads (a function's effects, returns, kept
    parameters) is summarised for the functions and classes other files of the run
    import by name, all of a module imported whole, and nothing of a file no file
    imports; the parameters stay, for the file's own call sites."""
    pkg = tmp_path / "chain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text(ENGINE + "\n\ndef eval_step(model, batch):\n    model.eval()\n")
    (pkg / "util.py").write_text(UTIL_ZERO)
    (pkg / "main.py").write_text(LOOP)
    (pkg / "other.py").write_text("from . import util\n")
    files = sorted(pkg.glob("*.py"))
    cache = Cache(tmp_path / "cache", "test")
    runner.run(files, ALL, Settings(), jobs=1, cache=cache)
    summaries = _summaries(files, cache)
    main = summaries["main.py"]  # imported by no file
    assert main["lean"] == []
    assert main["functions"]["main"] == {"params": ["model", "loader"], "lean": True}
    engine = summaries["engine.py"]  # main.py imports train_step from it
    assert engine["lean"] == ["train_step"]
    assert "effects" in engine["functions"]["train_step"]
    assert engine["functions"]["eval_step"] == {"params": ["model", "batch"], "lean": True}
    assert "lean" not in summaries["util.py"]  # `from . import util`: all of it
    assert "lean" not in summaries["__init__.py"]  # a package: imported by its modules


@pytest.mark.parametrize("jobs", [1, 2])
@pytest.mark.parametrize(
    ("fixture", "expected"),
    [("xfile_zero_grad_neg", []), ("xfile_zero_grad_pos", [("train.py", 13, "TL103")])],
)
def test_an_import_the_byte_scan_misses_costs_a_second_lint_not_a_finding(
    tmp_path, jobs, fixture, expected
):
    """`import torch; from . import hooks` names hooks.py after a semicolon, where the
    import scan reads the first statement of a line: hooks.py is summarised lean,
    train.py's view asks for the effects of `hooks.after_step`, and hooks.py is linted
    again in full before any view is given out. The findings are those of the plain
    spelling: TL103 when `after_step` does not zero the gradients, none when it does
    (without its effects, a false alarm)."""
    import shutil

    def findings(import_lines: str) -> list:
        pkg = tmp_path / f"p{len(import_lines)}"
        shutil.copytree(FIXTURES / fixture, pkg)
        train = (pkg / "train.py").read_text()
        (pkg / "train.py").write_text(
            train.replace("from .hooks import after_step\n", import_lines).replace(
                " after_step(", " hooks.after_step("
            )
        )
        result = runner.run(sorted(pkg.glob("*.py")), ALL, Settings(), jobs=jobs)
        return [(Path(f.path).name, f.line, f.code) for f in result.findings]

    assert findings("from . import hooks\n") == expected
    assert findings("import torch; from . import hooks\n") == expected


def test_a_read_of_what_a_lean_summary_left_out_is_noted():
    lean = {
        "root": "/r",
        "module": "pkg.helpers",
        "pkg": False,
        "imports": {},
        "stars": [],
        "exported": {},
        "defs": ["make"],
        "classes": {},
        "calls": [],
        "lean": [],
        "functions": {"make": {"params": ["opt"], "lean": True}},
    }
    caller = {
        "root": "/r",
        "module": "pkg.main",
        "pkg": False,
        "stars": [],
        "exported": {},
        "imports": {"make": [".helpers.make", "pkg.helpers.make"]},
        "defs": [],
        "classes": {},
        "calls": [],
        "functions": {},
    }
    index = ProjectIndex([lean, caller])
    index.view("/r", "pkg.helpers")  # its own view reads nothing it left out
    assert index.lean_read == set()
    index.view("/r", "pkg.main")  # `make`'s returns, for main's reference to it
    assert index.lean_read == {("/r", "pkg.helpers")}


def test_a_lean_summary_from_the_cache_is_not_served_once_a_file_imports_it(tmp_path):
    """hooks.py, cached lean while no file of the run imported it, is summarised again in
    the run that adds train.py, which imports after_step from it: no TL103 for the
    zero_grad in after_step."""
    import shutil

    pkg = tmp_path / "p"
    shutil.copytree(FIXTURES / "xfile_zero_grad_neg", pkg)
    cache = Cache(tmp_path / "cache", "test")
    alone = [pkg / "__init__.py", pkg / "hooks.py"]
    runner.run(alone, ALL, Settings(), jobs=1, cache=cache)
    assert _summaries(alone, cache)["hooks.py"]["lean"] == []
    files = sorted(pkg.glob("*.py"))
    assert runner.run(files, ALL, Settings(), jobs=1, cache=cache).findings == []
    assert "effects" in _summaries(files, cache)["hooks.py"]["functions"]["after_step"]


def test_import_lines_name_modules_and_what_is_imported_from_them():
    from trainlint.analysis.project import imported_names

    data = (
        b"import os, a.b as ab\n"
        b"from . import hooks\n"
        b"from .x import (  # noqa: F401\n    f,  # the first\n    g as gg,\n)\n"
        b"from .y import a, \\\n    b\n"
        b"from pkg.m import *\n"
        b"def load():\n    from .inner import h\n"
    )
    assert imported_names(data, "pkg.train", False) == {
        "os": None,
        "a.b": None,
        "pkg": {"hooks"},
        "pkg.hooks": None,  # (either may be the module)
        "pkg.x": {"f", "g"},
        "pkg.x.f": None,
        "pkg.x.g": None,
        "pkg.y": {"a", "b"},
        "pkg.y.a": None,
        "pkg.y.b": None,
        "pkg.m": None,
        "pkg.inner": {"h"},
        "pkg.inner.h": None,
    }


TRAIN_NO_FACT_WORDS = """from .hooks import after_step


def train(model, optimizer, loader, meter):
    for x, y in loader:
        model(x).sum().backward()
        optimizer.step()
        after_step(model, optimizer, meter)
"""


def test_a_file_no_file_imports_still_says_what_it_calls(tmp_path):
    """train.py, which no file imports and which spells none of the words of the role
    facts, is summarised lean, from its model all the same: what it calls through its
    imports (``uses``) is what its own view carries the callees' effects for."""
    import shutil

    pkg = tmp_path / "p"
    shutil.copytree(FIXTURES / "xfile_zero_grad_neg", pkg)
    (pkg / "train.py").write_text(TRAIN_NO_FACT_WORDS)
    files = sorted(pkg.glob("*.py"))
    cache = Cache(tmp_path / "cache", "test")
    runner.run(files, ALL, Settings(), jobs=1, cache=cache)
    train = _summaries(files, cache)["train.py"]
    assert train["lean"] == [] and train["uses"] == [".hooks.after_step"]


def test_calls_into_modules_the_run_lacks_are_left_out_of_the_summary(tmp_path):
    """A call into a top-level module no file of the run is under (`gym.make(env)`)
    names nothing the index can resolve: its argument facts are not taken, and the
    summary says which modules it left out. Calls into the run's own modules stay."""
    (tmp_path / "script.py").write_text(ONE_FILE)
    (tmp_path / "other.py").write_text(
        OTHER_CALLER.replace("from .script import", "from script import")
        + "\n\ndef env(model):\n    import gym\n    return gym.make('x', model)\n"
    )
    files = sorted(tmp_path.glob("*.py"))
    cache = Cache(tmp_path / "cache", "test")
    runner.run(files, ALL, Settings(), jobs=1, cache=cache)
    other = _summaries(files, cache)["other.py"]
    assert other["outside"] == ["gym"]
    assert [callee for callee, _ in other["calls"]] == ["script.train_one_epoch"]
    # alone, other.py's call into script.py goes outside the run too (a fresh cache: the
    # summary above, which kept more, would serve this run as well)
    cache = Cache(tmp_path / "cache2", "test")
    runner.run([tmp_path / "other.py"], ALL, Settings(), jobs=1, cache=cache)
    alone = _summaries([tmp_path / "other.py"], cache)["other.py"]
    assert alone["outside"] == ["gym", "script"] and alone["calls"] == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_summary_cached_without_a_module_is_not_served_once_the_run_has_it(tmp_path, jobs):
    """other.py, linted alone, is cached without its call into script.py (outside that
    run). The run that adds script.py summarises other.py again: its OneCycleLR call site
    says the helper's scheduler may be stepped per batch, so script.py's TL201 goes, as
    in a run without the cache. Serving the cached summary would keep the false alarm."""
    (tmp_path / "script.py").write_text(ONE_FILE)
    (tmp_path / "other.py").write_text(
        OTHER_CALLER.replace("from .script import", "from script import")
    )
    files = sorted(tmp_path.glob("*.py"))
    assert runner.run(files, ALL, Settings(), jobs=jobs).findings == []
    cache = Cache(tmp_path / "cache", "test")
    runner.run([tmp_path / "other.py"], ALL, Settings(), jobs=jobs, cache=cache)
    assert runner.run(files, ALL, Settings(), jobs=jobs, cache=cache).findings == []


def test_class_targets_from_the_tables_match_a_walk_of_the_class():
    # _init_attributes reads a class's assigned targets from the model's tables by line
    # (a bisect) instead of walking the class: same targets, nested defs and classes,
    # loops and withs included, none of the statements around the class.
    import ast
    from collections import Counter

    from trainlint.analysis.model import FileModel
    from trainlint.analysis.project_summary import _class_targets
    from trainlint.source import Source

    text = """
before = (w := 1)
@register(k2 := 5)
class A(Base):
    x: int
    def __init__(self, net, opt):
        self.net = net; self.opt = opt
        for self.i, j in pairs:
            with ctx() as (self.c, d):
                self.n += 1
        if (k := 3):
            pass
    class Inner:
        def f(self):
            self.net = None
    while True:
        break
after = A(1, 2); also = (w2 := 3)
class B: y = 2
"""
    tree = ast.parse(text)
    model = FileModel(tree, Source(text), "m.py")
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):

        def spelled(targets):
            return Counter(ast.unparse(t) for t in targets)

        assert spelled(_class_targets(cls, model)) == spelled(_class_targets(cls, None))
    a = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    spelled_a = {ast.unparse(t) for t in _class_targets(a, model)}
    assert {"k2", "k", "self.net"} <= spelled_a
    assert not spelled_a & {"after", "also", "w", "w2"}
