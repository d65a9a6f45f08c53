"""The escape analysis across files (issue 13): Thread bases resolved through the project
index, and models or optimizers that arrive as parameters before they escape."""

from __future__ import annotations

import textwrap
from pathlib import Path

from trainlint import lint_paths
from trainlint.analysis.project import ProjectIndex


def _summary(module, **kw):
    base = {"root": "/r", "module": module, "pkg": False, "imports": {}, "stars": [],
            "exported": {}, "defs": [], "functions": {}, "classes": {}, "calls": []}
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
    return sorted((Path(f.path).name, f.line) for f in lint_paths([pkg], jobs=1)
                  if f.code == code)


def test_thread_classes_resolve_through_project_bases_and_cut_cycles():
    index = ProjectIndex([
        _summary("p.base", classes={"Base": {"bases": ["threading.Thread"], "thread": True}}),
        _summary("p.mid", imports={"Base": [".base.Base", "p.base.Base"]},
                 classes={"Mid": {"bases": ["p.base.Base"]}, "Leaf": {"bases": ["Mid"]}}),
        _summary("p.loop", classes={"A": {"bases": ["B"]}, "B": {"bases": ["A"]}}),
    ])
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
