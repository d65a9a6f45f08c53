"""TL501 module-sent-to-remote."""

from __future__ import annotations

from collections.abc import Iterator

from trainlint.analysis.escape_callers import left_on_a_copy
from trainlint.analysis.model import FileModel
from trainlint.analysis.objects import objects
from trainlint.rules.base import Invalid, Report, Rule
from trainlint.rules.concurrency._shared import shown


class ModuleSentToRemote(Rule):
    """## What it does
    Flags a Ray remote call (`train.remote(model, opt)`, `Actor.remote(model, opt)`,
    `f.options(...).remote(...)`, `handle.method.remote(model)`, a `ray.put(model)`
    passed on) handing an `nn.Module` or optimizer to a remote function or actor that
    trains it, when the caller keeps using its model without loading the weights back
    (`model.load_state_dict(ray.get(...))`) or rebinding the name to the returned model.
    A model that arrives as a parameter counts when its role is known (an `nn.Module`
    annotation, or a model at every call site in the project), also when the optimizer
    the remote steps is a parameter whose models cannot be told.

    Ray Train too: a model or optimizer in a `TorchTrainer`'s (`DataParallelTrainer`,
    `HorovodTrainer`) `train_loop_config`, or bound with `tune.with_parameters` or
    `functools.partial`, that the worker loop trains, when after `trainer.fit()` the
    driver uses its own model again without loading weights into it or reaching for
    the result's checkpoint (`result.checkpoint`, `best_checkpoints`, `get_model`).

    ## Why is this bad?
    Ray pickles every argument: the remote worker trains a copy in another process.
    `loss.backward()` and `optimizer.step()` run there, on that copy; the caller's model
    does not move, and nothing raises. The script then evaluates, checkpoints or sends
    out again (each round restarting from the same initial weights) a model that was
    never trained, and the loss curves of the workers look perfectly healthy.

    ## Example
    ```python
    @ray.remote
    def train_step(model, optimizer, data, labels):
        optimizer.zero_grad()
        loss_fn(model(data), labels).backward()
        optimizer.step()

    for epoch in range(epochs):
        ray.get(train_step.remote(model, optimizer, data, labels))
    torch.save(model.state_dict(), "model.pt")  # the initial weights
    ```

    ## Use instead
    Return the trained weights and load them back (or keep the model in an actor and
    fetch its `state_dict()` when you need it):
    ```python
    @ray.remote
    def train_step(model, optimizer, data, labels):
        ...
        return model.state_dict()

    for epoch in range(epochs):
        model.load_state_dict(ray.get(train_step.remote(model, optimizer, data, labels)))
    ```
    or compute gradients remotely and apply them with the caller's optimizer. With Ray
    Train, build the model inside the worker loop, `ray.train.report(metrics,
    checkpoint=...)` from it, and load the weights from `result.checkpoint` after `fit()`.

    ## References
    - [Ray: passing objects to tasks (arguments are copied)](https://docs.ray.io/en/latest/ray-core/objects.html)
    - [Ray Train with PyTorch](https://docs.ray.io/en/latest/train/getting-started-pytorch.html)
    """

    code = "TL501"
    name = "module-sent-to-remote"
    message = "the Ray remote trains a copy of this model; the caller's weights never change"
    triggers = ("remote", "Trainer")
    confirm_with = "assert_weights_updated"
    valid = [
        # the remote only predicts (aliased import)
        """
import ray as r
import torch

@r.remote(num_gpus=1)
def predict(model, batch):
    with torch.no_grad():
        return model(batch)

model = torch.nn.Linear(4, 1)
preds = r.get([predict.remote(model, b) for b in batches])
print(model)
""",
        # gradients computed remotely, applied by the caller's optimizer
        """
import ray
import torch

@ray.remote
def compute_gradients(model, x, y):
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad for p in model.parameters()]

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches:
    grads = ray.get(compute_gradients.remote(model, x, y))
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    opt.step()
""",
        # the caller takes the trained model the remote returns
        """
import ray
import torch

@ray.remote
def train(model, opt, data):
    for x in data:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
    return model

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = ray.get(train.remote(model, opt, data))
torch.save(model.state_dict(), "model.pt")
""",
        # shadowed: `ray` is a parameter, not the Ray module
        """
import torch

def launch(ray, model, opt, data):
    @ray.remote
    def train(model, opt):
        for x in data:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
    ray.get(train.remote(model, opt))
    evaluate(model)
""",
        # no Ray at all: a git-like `remote` API
        """
class Repo:
    def remote(self, *args):
        return args

def train(model, optimizer):
    optimizer.step()

train = Repo()
train.remote(model, optimizer)
print(model)
""",
        # Ray Train: the config carries only hyperparameters; the worker builds its model
        """
import torch
from ray.train.torch import TorchTrainer

def train_func(config):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

model = torch.nn.Linear(4, 1)
result = TorchTrainer(train_func, train_loop_config={"lr": 0.1}).fit()
evaluate(model)
""",
        # Ray Train: built but never run in this file (someone else calls `fit()`)
        """
import torch
from ray.train.torch import TorchTrainer

def train_func(config):
    model = config["model"]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

def make_trainer(model):
    return TorchTrainer(train_func, train_loop_config={"model": model})
""",
        # Ray Train: the worker only evaluates the model it is given
        """
import torch
from ray.train.torch import TorchTrainer

def eval_func(config):
    model = config["model"]
    with torch.no_grad():
        for x, y in batches:
            report(model(x))

model = torch.nn.Linear(4, 1)
TorchTrainer(eval_func, train_loop_config={"model": model}).fit()
torch.save(model.state_dict(), "model.pt")
""",
        # parameters known as a model and an optimizer; the trained weights come back
        """
import ray
from torch import nn, optim
@ray.remote
def train(net, opt, data):
    for x in data:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
    return net.state_dict()
def fit(net: nn.Module, opt: optim.Optimizer, data):
    net.load_state_dict(ray.get(train.remote(net, opt, data)))
    return net
""",
    ]
    invalid = [
        # the seed's first example: the caller prints its (unchanged) weights
        Invalid(
            """
import ray
import torch.nn as nn
import torch.optim as optim

@ray.remote
def train_step(model, optimizer, data, labels):
    optimizer.zero_grad()
    loss = nn.MSELoss()(model(data), labels)
    loss.backward()
    optimizer.step()
    return model

model = nn.Linear(10, 1)
optimizer = optim.SGD(model.parameters(), lr=0.01)
trained_model = ray.get(train_step.remote(model, optimizer, data, labels))
print(list(model.parameters())[0])
""",
            line=15,
            column=25,
        ),
        # an actor built with the model (aliased import, `.options(...)`)
        Invalid(
            """
from ray import remote as ray_remote
import ray
import torch

@ray_remote
class TrainerActor:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr)

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        torch.nn.functional.mse_loss(self.model(x), y).backward()
        self.optimizer.step()

model = torch.nn.Linear(10, 1)
trainer = TrainerActor.options(num_gpus=1).remote(model, 0.01)
for x, y in loader:
    ray.get(trainer.train_step.remote(x, y))
torch.save(model.state_dict(), "final.pt")
""",
            line=17,
        ),
        # `ray.put(model)` then passed every epoch; the caller evaluates its unchanged copy
        Invalid(
            """
import ray
import torch

def fit_epoch(model, loader):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

remote_fit = ray.remote(fit_epoch)
model = torch.nn.Linear(8, 2)
ref = ray.put(model)
for epoch in range(10):
    ray.get(remote_fit.remote(ref, loader))
    print(epoch, evaluate(model))
""",
            line=15,
        ),
        # Ray Train: the model rides in `train_loop_config`; the driver saves its own copy
        Invalid(
            """
import torch
import ray.train.torch
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

def train_func(config):
    model = ray.train.torch.prepare_model(config["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for x, y in config["data"]:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

model = torch.nn.Linear(4, 1)
trainer = TorchTrainer(
    train_func,
    train_loop_config={"model": model, "lr": 0.1, "data": data},
    scaling_config=ScalingConfig(num_workers=2),
)
result = trainer.fit()
torch.save(model.state_dict(), "model.pt")
""",
            line=15,
        ),
        # a config dict built beforehand, an aliased trainer import, `config.get`
        Invalid(
            """
import torch
from ray.train import torch as rt

def loop(cfg):
    net = cfg.get("net")
    opt = torch.optim.Adam(net.parameters())
    for x in cfg["loader"]:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()

net = torch.nn.Linear(8, 2)
config = {"net": net, "loader": loader}
rt.TorchTrainer(loop, train_loop_config=config).fit()
print(evaluate(net))
""",
            line=14,
        ),
        # bound with `tune.with_parameters`; the driver returns the untrained model
        Invalid(
            """
import torch
from ray import tune
from ray.train.torch import TorchTrainer

def train_loop(config, model=None):
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

def fit(model):
    trainer = TorchTrainer(tune.with_parameters(train_loop, model=model),
                           train_loop_config={"lr": 0.01})
    trainer.fit()
    return model
""",
            line=13,
        ),
        # the same with the weights dropped: the optimizer's models come from the annotation
        Invalid(
            """
import ray
from torch import nn, optim
@ray.remote
def train(net, opt, data):
    for x in data:
        opt.zero_grad()
        net(x).sum().backward()
        opt.step()
def fit(net: nn.Module, opt: optim.Optimizer, data):
    ray.get(train.remote(net, opt, data))
    return net
""",
            line=10,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        esc = objects(model).escape_analysis
        for d in esc.remote_dispatches:
            if names := left_on_a_copy(esc, d):
                yield self.report(
                    d.call,
                    f"{shown(names)} trained inside the {d.via.value} `{d.name}`, on a copy: "
                    "the caller's weights never change; return the `state_dict()` and "
                    "`load_state_dict(ray.get(...))` it",
                )
        for d in esc.ray_train_dispatches:
            if d.runs_at is None or esc.restores_checkpoint(d.runs_at):  # not run, or restored
                continue
            if names := esc.trained_on_a_copy(d, d.runs_at, through_put=False):
                yield self.report(
                    d.call,
                    f"{shown(names)} trained inside the {d.via.value} `{d.name}`, on a copy "
                    "pickled into each worker: the driver's weights never change; "
                    "`ray.train.report(..., checkpoint=...)` from the workers and load the "
                    "weights from `result.checkpoint`",
                )
