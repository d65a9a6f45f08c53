"""The escape analysis across files (issue 13): Thread bases resolved through the project
index, and models or optimizers that arrive as parameters before they escape."""

from __future__ import annotations

import textwrap
from pathlib import Path

from trainlint import lint_paths
from trainlint.analysis.project import ProjectIndex


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


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return pkg


def _found(pkg: Path, code: str) -> list[tuple[str, int]]:
    return sorted((Path(f.path).name, f.line) for f in lint_paths([pkg], jobs=1) if f.code == code)


def test_thread_classes_resolve_through_project_bases_and_cut_cycles():
    index = ProjectIndex(
        [
            _summary("p.base", classes={"Base": {"bases": ["threading.Thread"], "thread": True}}),
            _summary(
                "p.mid",
                imports={"Base": [".base.Base", "p.base.Base"]},
                classes={"Mid": {"bases": ["p.base.Base"]}, "Leaf": {"bases": ["Mid"]}},
            ),
            _summary("p.loop", classes={"A": {"bases": ["B"]}, "B": {"bases": ["A"]}}),
        ]
    )
    mid = index.modules[("/r", "p.mid")]
    assert index.is_thread_class("/r", mid, "Mid")
    assert index.is_thread_class("/r", mid, "Leaf")  # through a class of its own module
    assert not index.is_thread_class("/r", index.modules[("/r", "p.loop")], "A")


def test_thread_subclass_of_a_project_base_trains_a_shared_model(tmp_path):
    base = """
        import threading

        class BaseWorker(threading.Thread):
            pass
    """
    workers = """
        from .base import BaseWorker

        class TrainWorker(BaseWorker):
            def __init__(self, model, opt, shard):
                super().__init__()
                self.model, self.opt, self.shard = model, opt, shard

            def run(self):
                for x in self.shard:
                    self.opt.zero_grad()
                    self.model(x).sum().backward()
                    self.opt.step()
    """
    main = """
        import torch
        from .workers import TrainWorker

        def main(shards):
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for w in [TrainWorker(model, opt, s) for s in shards]:
                w.start()
    """
    pkg = _project(tmp_path, {"base.py": base, "workers.py": workers, "main.py": main})
    assert _found(pkg, "TL503") == [("workers.py", 11), ("workers.py", 12)]
    # the base is no thread: the same worker runs where it is started
    (pkg / "base.py").write_text("class BaseWorker:\n    def start(self):\n        self.run()\n")
    assert _found(pkg, "TL503") == []


ENGINE_REMOTE = """
    import ray
    import torch

    @ray.remote
    def train(model, opt, data):
        for x in data:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()

    def fit_remote(model, opt, data):
        ray.get(train.remote(model, opt, data))
        return model
"""


def test_remote_learns_which_model_its_parameter_optimizer_holds_from_the_call_site(tmp_path):
    pkg = _project(tmp_path, {"engine.py": ENGINE_REMOTE})
    assert _found(pkg, "TL501") == []  # nothing says what `model` is: silent
    (pkg / "main.py").write_text(
        textwrap.dedent("""
        import torch
        from .engine import fit_remote

        def main(data):
            model = torch.nn.Linear(4, 1)
            fit_remote(model, torch.optim.SGD(model.parameters(), lr=0.1), data)
    """)
    )
    assert _found(pkg, "TL501") == [("engine.py", 12)]


def test_a_model_forwarded_only_without_grad_is_not_the_one_trained(tmp_path):
    engine = """
        import ray
        import torch

        @ray.remote
        def distill(model, opt, data, teacher):
            for x in data:
                with torch.no_grad():
                    target = teacher(x)
                opt.zero_grad()
                (model(x) - target).pow(2).sum().backward()
                opt.step()

        def fit_remote(model, opt, data, teacher):
            ray.get(distill.remote(model, opt, data, teacher))
            return {returned}
    """
    main = """
        import torch
        from .engine import fit_remote

        def main(data):
            model, teacher = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)
            fit_remote(model, torch.optim.SGD(model.parameters(), lr=0.1), data, teacher)
    """
    pkg = _project(tmp_path, {"engine.py": engine.format(returned="teacher"), "main.py": main})
    # the caller reads only the teacher afterwards, which the remote never trains
    assert _found(pkg, "TL501") == []
    (pkg / "engine.py").write_text(textwrap.dedent(engine.format(returned="model")).lstrip())
    assert _found(pkg, "TL501") == [("engine.py", 14)]


def test_module_level_threads_joined_one_at_a_time_do_not_overlap(tmp_path):
    script = """
        import threading
        import torch

        def train(model, opt, shard):
            for x in shard:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        t1 = threading.Thread(target=train, args=(model, opt, shard_a))
        t1.start()
        {join}
        t2 = threading.Thread(target=train, args=(model, opt, shard_b))
        t2.start()
        t1.join()
        t2.join()
    """
    pkg = _project(tmp_path, {"script.py": script.format(join="t1.join()")})
    assert _found(pkg, "TL503") == []
    (pkg / "script.py").write_text(textwrap.dedent(script.format(join="pass")).lstrip("\n"))
    assert _found(pkg, "TL503") == [("script.py", 7), ("script.py", 8)]


def test_actor_built_from_parameter_model_and_optimizer(tmp_path):
    engine = """
        import ray
        import torch
        from torch import nn, optim

        @ray.remote
        class Learner:
            def __init__(self, model, opt):
                self.model, self.opt = model, opt

            def step(self, x, y):
                self.opt.zero_grad()
                torch.nn.functional.mse_loss(self.model(x), y).backward()
                self.opt.step()

            def weights(self):
                return self.model.state_dict()

        def fit(model: nn.Module, opt: optim.Optimizer, data):
            learner = Learner.remote(model, opt)
            for x, y in data:
                ray.get(learner.step.remote(x, y))
            {restore}
            return model
    """
    pkg = _project(tmp_path, {"engine.py": engine.format(restore="pass")})
    assert _found(pkg, "TL501") == [("engine.py", 19)]
    restored = engine.format(restore="model.load_state_dict(ray.get(learner.weights.remote()))")
    (pkg / "engine.py").write_text(textwrap.dedent(restored).lstrip())
    assert _found(pkg, "TL501") == []
    # no annotation and no call site: what `model` is cannot be told
    plain = engine.format(restore="pass").replace(
        "model: nn.Module, opt: optim.Optimizer", "model, opt"
    )
    (pkg / "engine.py").write_text(textwrap.dedent(plain).lstrip())
    assert _found(pkg, "TL501") == []
