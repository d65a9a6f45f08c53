"""Where a dispatched model is used after the function that dispatched it returns (issue 35):
the caller of a helper or trainer method that starts and joins the workers, followed
through the same file and, through the project index, across files."""

from __future__ import annotations

import textwrap
from pathlib import Path

from trainlint import lint_paths, lint_source

WORKER = """
import torch
import torch.multiprocessing as mp

def _train(model, shard):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in shard:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

def launch(model, shards):
    procs = [mp.Process(target=_train, args=(model, s)) for s in shards]
    for p in procs:
        p.start()
    for p in procs:
        p.join()

class Hogwild:
    def __init__(self, model, shards):
        self.model = model
        self.shards = shards

    def fit(self):
        procs = [mp.Process(target=_train, args=(self.model, s)) for s in self.shards]
        for p in procs:
            p.start()
        for p in procs:
            p.join()

    def run(self):
        self.fit()
"""


def _lines(src: str, code: str) -> list[int]:
    text = textwrap.dedent(WORKER) + textwrap.dedent(src)
    return sorted(f.line for f in lint_source(text, select=[code]))


def test_the_use_after_a_helper_that_starts_and_joins_is_in_its_caller():
    assert _lines("", "TL502") == []  # nobody uses the model afterwards
    used = """
        def main(shards):
            model = torch.nn.Linear(4, 1)
            launch(model, shards)
            print(model)
    """
    assert _lines(used, "TL502") == [13]
    loaded = used.replace(
        "print(model)", 'model.load_state_dict(torch.load("w.pt", weights_only=True))'
    )
    assert _lines(loaded, "TL502") == []
    shared = used.replace(
        "launch(model, shards)", "model.share_memory()\n    launch(model, shards)"
    )
    assert _lines(shared, "TL502") == []


def test_a_trainer_method_maps_self_attributes_onto_the_callers_receiver():
    used = """
        def main(shards):
            trainer = Hogwild(torch.nn.Linear(4, 1), shards)
            trainer.run()
            torch.save(trainer.model.state_dict(), "m.pt")
    """
    assert _lines(used, "TL502") == [25]  # main -> run -> fit, two callers up
    other = used.replace("trainer.model.state_dict()", "trainer.shards")
    assert _lines(other, "TL502") == []  # the caller reads something else


def _project(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text).lstrip("\n"))
    return pkg


def _found(pkg: Path, code: str) -> list[tuple[str, int]]:
    return sorted((Path(f.path).name, f.line) for f in lint_paths([pkg], jobs=1) if f.code == code)


REMOTE = """
import ray
import torch

@ray.remote
def train(model, data):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return model.state_dict()

class RayFit:
    def __init__(self, model):
        self.model = model

    def fit(self, data):
        ray.get(train.remote(self.model, data))

def main(data):
    fitter = RayFit(torch.nn.Linear(4, 1))
    fitter.fit(data)
    return fitter.model
"""


def test_a_remote_trained_in_a_method_whose_caller_reads_the_model():
    assert [f.line for f in lint_source(REMOTE, select=["TL501"])] == [19]
    fixed = REMOTE.replace(
        "        ray.get(train.remote(self.model, data))",
        "        self.model.load_state_dict(ray.get(train.remote(self.model, data)))",
    )
    assert lint_source(fixed, select=["TL501"]) == []
    unused = REMOTE.replace("    return fitter.model\n", "")
    assert lint_source(unused, select=["TL501"]) == []


TASKS = """
    import ray
    import torch

    @ray.remote
    def train_remote(model, data):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in data:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        return model.state_dict()
"""


def test_a_remote_of_another_module_is_resolved_through_a_module_import(tmp_path):
    driver = """
        import torch

        from . import tasks

        def main(data):
            model = torch.nn.Linear(4, 1)
            ray_ref = tasks.train_remote.remote(model, data)
            torch.save(model.state_dict(), "m.pt")
            return ray_ref
    """
    pkg = _project(tmp_path, {"tasks.py": TASKS, "driver.py": driver})
    assert _found(pkg, "TL501") == [("driver.py", 7)]
    (pkg / "tasks.py").write_text(textwrap.dedent(TASKS.replace("@ray.remote\n", "")))
    assert _found(pkg, "TL501") == []  # a plain function: nothing is remote


def test_a_trainer_method_in_another_file_and_its_caller(tmp_path):
    worker = """
        import torch

        def train(model, shard):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for x in shard:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """
    trainer = """
        import multiprocessing as mp

        from .worker import train

        class Trainer:
            def __init__(self, model, shards):
                self.model, self.shards = model, shards

            def fit(self):
                procs = [mp.Process(target=train, args=(self.model, s)) for s in self.shards]
                for p in procs:
                    p.start()
                for p in procs:
                    p.join()
    """
    main = """
        import torch

        from .trainer import Trainer

        def main(shards):
            trainer = Trainer(torch.nn.Linear(4, 1), shards)
            trainer.fit()
            torch.save(trainer.model.state_dict(), "m.pt")
    """
    files = {"worker.py": worker, "trainer.py": trainer, "main.py": main}
    pkg = _project(tmp_path, files)
    assert _found(pkg, "TL502") == [("trainer.py", 10)]
    (pkg / "main.py").write_text(textwrap.dedent(main.replace("trainer.model.state_dict()", "{}")))
    assert _found(pkg, "TL502") == []  # the caller never reads the model again


def test_a_remote_imported_from_a_script_directory_module(tmp_path):
    """`import workers` / `from workers import train_remote` beside the script; the
    remote steps an optimizer it receives, so the model counts where it is known."""
    workers = """
        import ray
        import torch

        @ray.remote
        def train_remote(model, opt, data):
            for x in data:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    """
    main = """
        import ray
        import torch

        import workers
        from workers import train_remote

        def main(data):
            model = torch.nn.Linear(4, 1)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ray.get(workers.train_remote.remote(model, opt, data))
            ray.get(train_remote.remote(model, opt, data))
            torch.save(model.state_dict(), "m.pt")
    """
    for name, text in {"workers.py": workers, "main.py": main}.items():
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip("\n"))
    assert _found(tmp_path, "TL501") == [("main.py", 10), ("main.py", 11)]
