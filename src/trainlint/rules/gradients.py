"""TL1: gradient flow. The order of backward, step, zero_grad and gradient reads in a step."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.flow import Taint, grad_enabled_at
from trainlint.analysis.model import FileModel, call_name, dotted, walk_local
from trainlint.analysis.roles import Role, parameter_owners
from trainlint.analysis.steps import (
    STEP_LOOP_TRIGGERS,
    Event,
    Kind,
    StepLoop,
    backward_calls,
    backward_value,
)
from trainlint.rules._paths import Reported, precise_step_loops
from trainlint.rules.base import Invalid, Report, Rule

TRAINING_TRIGGERS = STEP_LOOP_TRIGGERS


def _single_optimizer(loop: StepLoop) -> bool:
    return len(loop.targets(Kind.STEP)) <= 1


def _zero_matches_step(model: FileModel, zero: Event, step: Event, loop: StepLoop) -> bool:
    """Does this zero_grad clear the gradients that this step applies?"""
    if zero.target is not None and zero.target == step.target:
        return True
    if not _single_optimizer(loop):
        return False
    if zero.target is None:
        return True  # `p.grad = None` over the parameters
    node = zero.node
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        role = model.roles.role(node.func.value, by_name=True)
        if role is Role.MODEL:
            return True
        if role is Role.OPTIMIZER:
            return False  # another optimizer's zero_grad (two-optimizer loops)
        if isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
            return True  # a LightningModule / nn.Module zeroing itself
    return False


class GradNormAfterZeroGrad(Rule):
    """## What it does
    Flags a gradient read (a norm, a clip, a `.grad` statistic, a logged grad norm) that
    runs after `zero_grad()` in the same training step, with no backward in between.

    ## Why is this bad?
    After `zero_grad()` every gradient is zero (or `None`): the logged gradient norm is
    always 0.0 and a clip at that point does nothing. The dashboard says "no gradient
    flow" while training runs normally, or hides a real explosion, and people lose days
    chasing a measurement bug. A read placed at the top of the loop, before this step's
    backward, sees the previous step's cleared gradients just the same.

    ## Example
    ```python
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            grad_norm = clip_grad_norm_(model.parameters(), float("inf"))  # always 0
            wandb.log({"grad_norm": grad_norm})
    ```

    ## Use instead
    ```python
    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        grad_norm = clip_grad_norm_(model.parameters(), float("inf"))
        optimizer.step()
        optimizer.zero_grad()
        if step % 100 == 0:
            wandb.log({"grad_norm": grad_norm})
    ```

    ## References
    - [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
    """

    code = "TL101"
    name = "grad-norm-after-zero-grad"
    message = "gradients are read after `zero_grad()` in the same step: the value is always zero"
    triggers = ("grad",)
    confirm_with = "assert_grads_nonzero"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        # read after the step but before the next zero_grad
        """
import torch
for i, (x, y) in enumerate(loader):
    optimizer.zero_grad(set_to_none=True)
    criterion(model(x), y).backward()
    optimizer.step()
    if i % 50 == 0:
        print(sum(p.grad.norm() for p in model.parameters()))
""",
        # `p.grad is None` checks are not statistics
        """
import torch
for x in loader:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
""",
        # two optimizers (GAN): reads of one model's grads after the other's zero_grad
        """
import torch
for real in loader:
    opt_d.zero_grad()
    loss_d(real).backward()
    opt_d.step()
    opt_g.zero_grad()
    loss_g(real).backward()
    g_norm = torch.nn.utils.clip_grad_norm_(gen.parameters(), 5.0)
    opt_g.step()
""",
        # no torch: an unrelated `zero_grad`/`grad` API
        """
for item in queue:
    item.zero_grad()
    print(item.grad)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 100 == 0:
        wandb.log({"grad_norm": torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))})
""",
            line=8,
        ),
        # aliased import, helper that reads .grad, called from the step body
        Invalid(
            """
from torch.nn import utils as U

def grad_norm(model):
    return sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5

for epoch in range(3):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        log(grad_norm(model))
""",
            line=12,
        ),
        # trainer class, reset helper, accumulation branch as in the seed
        Invalid(
            """
import torch

class Trainer:
    def reset_grad(self):
        self.optimizer.zero_grad()

    def train_epoch(self):
        for i, batch in enumerate(self.loader):
            loss = self.model(batch).mean()
            loss.backward()
            if (i + 1) % self.accum == 0:
                self.optimizer.step()
                self.reset_grad()
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
""",
            line=14,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        from trainlint.rules.throughput import is_test_file

        if is_test_file(model.path):
            return  # tests read gradients after zero_grad() to assert that it worked
        seen = Reported()
        for loop in precise_step_loops(model):
            if not _single_optimizer(loop):
                continue
            end_states = set()
            for path in loop.paths:
                last = None
                for e in path:
                    if e.kind in (Kind.BACKWARD, Kind.ZERO):
                        last = e.kind
                end_states.add(last)
            for path in loop.paths:
                state: Kind | None = None
                for e in path:
                    if e.kind in (Kind.BACKWARD, Kind.ZERO):
                        state = e.kind
                    elif e.kind in (Kind.READ, Kind.CLIP):
                        zeroed = state is Kind.ZERO or (
                            state is None and end_states == {Kind.ZERO}
                            and any(x.kind is Kind.BACKWARD for x in path)
                        )
                        if zeroed:
                            node = model.steps.anchor(e)
                            if seen.first(node):
                                yield self.report(node)


class ZeroGradBeforeStep(Rule):
    """## What it does
    Flags `zero_grad()` called between `backward()` and the optimizer step of the same
    step, clearing the gradients the step was about to apply.

    ## Why is this bad?
    The optimizer steps with zero (or `None`) gradients: the weights never change, or
    only weight decay and momentum from earlier steps move them. The loss stays flat
    and nothing raises.

    ## Example
    ```python
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    ```

    ## Use instead
    ```python
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    ```

    ## References
    - [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
    """

    code = "TL102"
    name = "zero-grad-before-step"
    message = "`zero_grad()` between `backward()` and the optimizer step: the step applies no update"
    triggers = ("zero_grad", ".grad")
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
""",
        # GAN: G's zero_grad between D's backward and... G's step after G's backward
        """
import torch
for real in loader:
    loss_d = d_loss(real)
    loss_d.backward()
    opt_g.zero_grad()
    opt_d.step()
""",
        # accumulation with zero_grad after the step
        """
import torch.optim as optim
opt = optim.SGD(model.parameters(), lr=0.1)
for i, x in enumerate(loader):
    (model(x).mean() / 4).backward()
    if (i + 1) % 4 == 0:
        opt.step()
        opt.zero_grad()
""",
        # no torch
        """
for job in jobs:
    job.backward()
    job.zero_grad()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
""",
            line=5,
        ),
        Invalid(
            """
from torch import optim

class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = optim.Adam(model.parameters())

    def clear(self):
        for p in self.model.parameters():
            p.grad = None

    def train_step(self, batch):
        loss = self.model(batch).sum()
        loss.backward()
        self.clear()
        self.opt.step()
""",
            line=15,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            for path in loop.paths:
                last_backward = -1
                for i, e in enumerate(path):
                    if e.kind is Kind.BACKWARD:
                        last_backward = i
                    elif e.kind is Kind.ZERO and last_backward >= 0:
                        if any(x.kind is Kind.STEP for x in path[last_backward + 1 : i]):
                            continue
                        for s in path[i + 1 :]:
                            if s.kind is Kind.BACKWARD:
                                break
                            if s.kind is Kind.STEP and _zero_matches_step(model, e, s, loop):
                                node = model.steps.anchor(e)
                                if seen.first(node):
                                    yield self.report(node)
                                break


class MissingZeroGrad(Rule):
    """## What it does
    Flags an optimizer step in a training loop where, on some path through the loop body
    (helpers included), backward and the step run but nothing clears the gradients.

    ## Why is this bad?
    `backward()` adds to `.grad`. Without `zero_grad()` every step applies the sum of
    all gradients so far: the effective learning rate grows each batch and training
    diverges or oscillates, with no error. Gradient accumulation is deliberate only when
    the step (and the clearing) happen every N batches; that form stays silent.

    ## Example
    ```python
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
    ```

    ## References
    - [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
    """

    code = "TL103"
    name = "missing-zero-grad"
    message = "no `zero_grad()` on this path of the training loop: gradients accumulate across batches"
    triggers = TRAINING_TRIGGERS
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
""",
        # zeroing by hand, in a nested loop
        """
import torch
for x, y in loader:
    criterion(model(x), y).backward()
    optimizer.step()
    for p in model.parameters():
        p.grad = None
""",
        # accumulation: zero_grad in the step's branch
        """
import torch
for i, (x, y) in enumerate(loader):
    (criterion(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        # accumulation with the clearing at the start of a window
        """
import torch
for i, (x, y) in enumerate(loader):
    if i % accum == 0:
        optimizer.zero_grad()
    (criterion(model(x), y) / accum).backward()
    if (i + 1) % accum == 0:
        optimizer.step()
""",
        # LBFGS closure clears inside the step
        """
import torch.optim as optim
opt = optim.LBFGS(model.parameters())
for x, y in loader:
    def closure():
        opt.zero_grad()
        loss = crit(model(x), y)
        loss.backward()
        return loss
    opt.step(closure)
""",
        # no torch: a game environment
        """
for episode in range(10):
    obs = env.reset()
    for t in range(100):
        obs, reward, done, info = env.step(agent.act(obs))
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
""",
            line=5,
        ),
        # zero_grad only in the AMP branch
        Invalid(
            """
import torch.optim as optim
opt = optim.AdamW(model.parameters())
for x, y in loader:
    if use_amp:
        scaler.scale(crit(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    else:
        crit(model(x), y).backward()
        opt.step()
""",
            line=11,
        ),
        # zero_grad once per epoch only
        Invalid(
            """
import torch
for epoch in range(10):
    optimizer.zero_grad()
    for x, y in loader:
        criterion(model(x), y).backward()
        optimizer.step()
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            if isinstance(loop.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue  # a step function called from elsewhere: its caller may clear grads
            has_guarded_zero = any(e.under_counter_guard() for e in loop.of(Kind.ZERO))
            for path in loop.paths:
                kinds = {e.kind for e in path}
                if Kind.STEP not in kinds or Kind.ZERO in kinds:
                    continue
                if not any(e.kind is Kind.BACKWARD and isinstance(e.node, ast.Call) for e in path):
                    continue  # `p.grad = g` overwrites: nothing accumulates
                step = next(e for e in path if e.kind is Kind.STEP)
                if step.under_counter_guard() and has_guarded_zero:
                    continue  # accumulation window cleared by a correlated guard
                node = model.steps.anchor(step)
                if seen.first(node):
                    yield self.report(node)


def _guard_mentions_loop_state(guards: tuple[tuple[ast.If, bool], ...], loop: StepLoop) -> bool:
    targets: set[str] = set()
    node = loop.node
    if isinstance(node, (ast.For, ast.AsyncFor)):
        for sub in ast.walk(node.target):
            if isinstance(sub, ast.Name):
                targets.add(sub.id)
    for g, _ in guards:
        for sub in ast.walk(g.test):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
                return True
            if isinstance(sub, ast.Name) and sub.id in targets:
                return True
            if isinstance(sub, ast.Compare):
                return True
    return False


class StepBeforeBackward(Rule):
    """## What it does
    Flags an optimizer step that runs before the backward pass of the same loop
    iteration, with no backward before it.

    ## Why is this bad?
    The step applies whatever is in `.grad` at that moment: the previous batch's
    gradients, or nothing on the first batch. Every update lags one batch behind (and
    with a `zero_grad()` in between, never happens at all). Training looks plausible
    and converges worse.

    ## Example
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        optimizer.step()
        criterion(model(x), y).backward()
    ```

    ## Use instead
    ```python
    for x, y in loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
    ```

    ## References
    - [PyTorch optimization loop](https://pytorch.org/tutorials/beginner/basics/optimization_tutorial.html)
    """

    code = "TL104"
    name = "step-before-backward"
    message = "the optimizer steps before this iteration's backward: it applies stale gradients"
    triggers = TRAINING_TRIGGERS
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
""",
        # deliberate delayed update guarded by the loop counter
        """
import torch
for i, x in enumerate(loader):
    if i > 0:
        optimizer.step()
        optimizer.zero_grad()
    model(x).sum().backward()
""",
        # closure form: the closure backpropagates inside step()
        """
from torch import optim
opt = optim.LBFGS(params)
for x in loader:
    def closure():
        opt.zero_grad()
        l = f(x)
        l.backward()
        return l
    opt.step(closure)
""",
        # no torch
        """
for t in range(100):
    sim.step()
    sim.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    optimizer.step()
    loss = criterion(model(x), y)
    loss.backward()
""",
            line=4,
        ),
        Invalid(
            """
import torch.optim as O

def train(model, loader, accelerator):
    opt = O.AdamW(model.parameters())
    for batch in loader:
        opt.step()
        opt.zero_grad()
        out = model(**batch)
        accelerator.backward(out.loss)
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            steps = loop.of(Kind.STEP)
            for step in steps:
                if _guard_mentions_loop_state(step.guards, loop):
                    continue
                containing = [p for p in loop.paths if any(e is step for e in p)]
                if not containing:
                    continue
                bad = True
                later = False
                for p in containing:
                    i = next(k for k, e in enumerate(p) if e is step)
                    if any(e.kind is Kind.BACKWARD for e in p[:i]):
                        bad = False
                        break
                    if any(e.kind is Kind.BACKWARD for e in p[i + 1 :]):
                        later = True
                if bad and later:
                    node = model.steps.anchor(step)
                    if seen.first(node):
                        yield self.report(node)


class BackwardUnderNoGrad(Rule):
    """## What it does
    Flags `backward()` inside `torch.no_grad()` / `torch.inference_mode()` (a `with` block
    or a decorated function), and `backward()` on a loss that was computed inside one.

    ## Why is this bad?
    Under no-grad nothing records a graph: the loss has no `grad_fn`, so `backward()`
    either raises, or, when some other term still requires grad (a regulariser on the
    parameters), silently backpropagates only that term. The model's main weights
    never receive a gradient.

    ## Example
    ```python
    with torch.no_grad():
        loss = criterion(model(x), y)
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = criterion(model(x), y)
    loss.backward()
    ```

    ## References
    - [Locally disabling gradient computation](https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation)
    """

    code = "TL105"
    name = "backward-under-no-grad"
    message = "`backward()` on a value computed without autograd recording (`no_grad`/`inference_mode`)"
    triggers = ("no_grad", "inference_mode", "set_grad_enabled")
    confirm_with = "assert_grads_nonzero"
    valid = [
        """
import torch
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    with torch.no_grad():
        ema.update(model)
""",
        # enable_grad inside no_grad re-enables recording
        """
import torch
with torch.no_grad():
    with torch.enable_grad():
        loss = model(x).sum()
        loss.backward()
""",
        # evaluation under no_grad, training loss recomputed outside
        """
import torch
with torch.no_grad():
    loss = criterion(model(xv), yv)
loss = criterion(model(x), y)
loss.backward()
""",
        # shadowed: a local `torch` object
        """
def run(torch, model, x):
    with torch.no_grad():
        model(x).sum().backward()
""",
        # no torch
        """
with no_grad():
    job.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
with torch.no_grad():
    loss = criterion(model(x), y)
loss.backward()
""",
            line=4,
        ),
        Invalid(
            """
from torch import inference_mode

@inference_mode()
def train_step(model, opt, batch):
    loss = model(batch).mean()
    loss.backward()
    opt.step()
""",
            line=6,
        ),
        Invalid(
            """
import torch as T
for x, y in loader:
    with T.set_grad_enabled(False):
        out = model(x)
        loss = crit(out, y) + reg
        loss.backward()
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for call in backward_calls(model):
            enabled, _ = grad_enabled_at(model, call)
            if not enabled:
                yield self.report(call)
                continue
            value = backward_value(model, call)
            if value is not None and self._computed_without_grad(model, value, call):
                yield self.report(call)

    @staticmethod
    def _computed_without_grad(model: FileModel, value: ast.AST, call: ast.Call) -> bool:
        """The loss itself, or one of its additive terms that is a loss or model output,
        was assigned inside a no-grad block of the same function."""
        fn = model.function_of(call)
        names = []
        if isinstance(value, (ast.Name, ast.Attribute)):
            names.append(value)
        for term in model.flow.terms(value):
            if isinstance(term, ast.Name) and term not in names:
                names.append(term)
        for ref in names:
            name = dotted(ref)
            found = model.flow.definition(name, ref) if name else None
            if found is None:
                continue
            stmt, val = found
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                continue
            if model.function_of(stmt) is not fn or grad_enabled_at(model, stmt)[0]:
                continue
            if ref is value or _is_loss_or_output(model, val):
                return True
        return False


_LOSS_FUNCS = ("loss", "cross_entropy", "nll", "mse", "l1", "kl_div", "bce", "huber", "hinge",
               "margin", "triplet", "ctc", "focal", "dice")


def _is_loss_or_output(model: FileModel, value: ast.AST) -> bool:
    """A loss-function or model call (what carries the graph a backward needs)."""
    if not isinstance(value, ast.Call):
        return False
    if model.flow._is_model_call(value.func):
        return True
    if model.roles.role(value.func) is Role.CRITERION:
        return True
    qual = model.qualname(value.func) or ""
    name = (call_name(value) or "").lower()
    return qual.startswith("torch.nn.functional.") and any(w in name for w in _LOSS_FUNCS) or (
        "loss" in name or name in ("criterion", "loss_fn")
    )


def _is_module_construction(model: FileModel, node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    found = model.roles.classify(node)
    return len(found) == 1 and found[0] is not None and found[0].role is Role.MODEL and (
        found[0].call is node
    )


def _module_elements(model: FileModel, value: ast.AST) -> str | None:
    """"list" or "dict" when ``value`` builds a plain container of freshly built modules."""
    if isinstance(value, ast.Call) and call_name(value) in ("list", "tuple", "dict") and (
        model.qualname(value.func) or ""
    ).startswith("builtins.") and len(value.args) == 1 and not value.keywords:
        inner = _module_elements(model, value.args[0])
        if inner is None and isinstance(value.args[0], ast.GeneratorExp):
            return "list" if _is_module_construction(model, value.args[0].elt) else None
        return inner
    if isinstance(value, (ast.List, ast.Tuple)):
        if value.elts and all(_is_module_construction(model, e) for e in value.elts):
            return "list"
        return None
    if isinstance(value, ast.ListComp):
        return "list" if _is_module_construction(model, value.elt) else None
    if isinstance(value, ast.Dict):
        if value.values and all(k is not None for k in value.keys) and all(
            _is_module_construction(model, v) for v in value.values
        ):
            return "dict"
        return None
    if isinstance(value, ast.DictComp):
        return "dict" if _is_module_construction(model, value.value) else None
    return None


def nn_prefix(model: FileModel) -> str | None:
    """How this file can spell ``torch.nn``: ``nn`` or ``torch.nn`` (module scope)."""
    b = model.imports._scopes.get(id(model.tree))
    if b is None:
        return None
    for local, q in b.imports.items():
        if q == "torch.nn" and local not in b.others:
            return local
    for local, q in b.imports.items():
        if q == "torch" and local not in b.others:
            return f"{local}.nn"
    return None


class UnregisteredSubmodules(Rule):
    """## What it does
    Flags an `nn.Module` that stores submodules in a plain `list`, `tuple` or `dict`
    attribute (`self.layers = [nn.Linear(...) for _ in range(n)]`).

    ## Why is this bad?
    `nn.Module` registers only attributes that are modules themselves. Modules inside a
    plain container are invisible to `.parameters()`, so the optimizer never updates
    them; `.to(device)` leaves them on the CPU; `state_dict()` does not save them;
    `.train()`/`.eval()` do not reach them. The model trains with those layers frozen at
    their random initialisation, silently.

    ## Example
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(64, 64) for _ in range(4)]
    ```

    ## Use instead
    ```python
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(4)])
    ```

    ## Fix safety
    Wrapping the container in `nn.ModuleList` / `nn.ModuleDict` is safe: indexing,
    iteration and `len()` keep working, and the submodules become registered. Dicts
    whose keys are not all string literals are reported without a fix (`nn.ModuleDict`
    needs string keys).

    ## References
    - [torch.nn.ModuleList](https://pytorch.org/docs/stable/generated/torch.nn.ModuleList.html)
    """

    code = "TL106"
    name = "unregistered-submodules"
    message = "submodules in a plain container are not registered: invisible to `.parameters()`, `.to()`, `state_dict()`"
    triggers = ("Module",)
    fix_safety = "safe"
    confirm_with = "assert_weights_updated"
    valid = [
        """
from torch import nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
""",
        # a plain list that is then registered through nn.Sequential
        """
import torch.nn as nn
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        layers = [nn.Linear(4, 4), nn.ReLU()]
        self.layers = [nn.Linear(4, 4), nn.ReLU()]
        self.net = nn.Sequential(*self.layers)
""",
        # plain data in a list
        """
from torch import nn
class Net(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.sizes = [64, 128, 256]
        self.names = {"a": "relu"}
""",
        # not an nn.Module: a plain container class
        """
from torch import nn
class Bag:
    def __init__(self):
        self.parts = [nn.Linear(2, 2), nn.Linear(2, 2)]
""",
        # no torch: a local `nn` namespace
        """
class Net(Base):
    def __init__(self):
        self.blocks = [Block() for _ in range(3)]
""",
    ]
    invalid = [
        Invalid(
            """
from torch import nn

class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = [nn.Linear(64, 64) for _ in range(n)]
""",
            line=6,
            fixed="""
from torch import nn

class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(n)])
""",
        ),
        Invalid(
            """
import torch

class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = {"cls": torch.nn.Linear(8, 3), "box": torch.nn.Linear(8, 4)}
""",
            line=6,
            fixed="""
import torch

class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = torch.nn.ModuleDict({"cls": torch.nn.Linear(8, 3), "box": torch.nn.Linear(8, 4)})
""",
        ),
        # an empty list filled with append
        Invalid(
            """
import torch.nn as nn

class Block(nn.Module):
    pass

class Tower(Block):
    def __init__(self, depth):
        super().__init__()
        self.stages = []
        for _ in range(depth):
            self.stages.append(Block())
""",
            line=9,
            fixed="""
import torch.nn as nn

class Block(nn.Module):
    pass

class Tower(Block):
    def __init__(self, depth):
        super().__init__()
        self.stages = nn.ModuleList()
        for _ in range(depth):
            self.stages.append(Block())
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        from trainlint.fix import replace_node

        prefix = nn_prefix(model)
        for cls in model.classes:
            if not model.roles.is_module_class(cls):
                continue
            uses = self._attribute_uses(model, cls)
            if uses is None:
                continue
            for node in walk_local(cls):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for stmt in walk_local(node):
                    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                        continue
                    target = stmt.targets[0]
                    if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                            and target.value.id == "self"):
                        continue
                    attr = target.attr
                    if attr in uses["registered"]:
                        continue
                    kind = _module_elements(model, stmt.value)
                    if kind is None and isinstance(stmt.value, ast.List) and not stmt.value.elts:
                        if attr in uses["appended"]:
                            kind = "empty"
                    if kind is None:
                        continue
                    fix = None
                    if prefix is not None:
                        text = model.source.segment(stmt.value)
                        if kind == "empty":
                            new = f"{prefix}.ModuleList()"
                        elif kind == "list":
                            new = f"{prefix}.ModuleList({text})"
                        elif isinstance(stmt.value, ast.Dict) and all(
                            isinstance(k, ast.Constant) and isinstance(k.value, str)
                            for k in stmt.value.keys
                        ):
                            new = f"{prefix}.ModuleDict({text})"
                        else:
                            new = None
                        if new is not None:
                            wrapper = "ModuleDict" if "Dict" in new else "ModuleList"
                            fix = self.fix(replace_node(model, stmt.value, new),
                                           message=f"wrap in `{prefix}.{wrapper}`")
                    yield self.report(stmt, fix=fix)

    @staticmethod
    def _attribute_uses(model: FileModel, cls: ast.ClassDef) -> dict[str, set[str]] | None:
        """Attributes registered some other way (passed to a call, add_module) or appended to."""
        registered: set[str] = set()
        appended: set[str] = set()
        for node in ast.walk(cls):
            if isinstance(node, ast.Call):
                name = call_name(node)
                if name in ("add_module", "register_module", "setattr", "register_buffer"):
                    return None  # registration by hand: cannot tell which attributes
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    inner = arg.value if isinstance(arg, ast.Starred) else arg
                    for sub in ast.walk(inner):
                        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                                and sub.value.id == "self"):
                            registered.add(sub.attr)
                func = node.func
                if (isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "insert")
                        and isinstance(func.value, ast.Attribute)
                        and isinstance(func.value.value, ast.Name)
                        and func.value.value.id == "self"):
                    registered.discard(func.value.attr)
                    if any(_is_module_construction(model, a) for a in node.args) or any(
                        _module_elements(model, a) for a in node.args
                    ):
                        appended.add(func.value.attr)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
                if _module_elements(model, node.value):
                    appended.add(node.target.attr)
        # `self.x.append(...)` puts self.x among call *receivers*, not arguments
        return {"registered": registered - appended, "appended": appended}


_REBUILD_KEEPS = {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval",
                  "requires_grad_", "share_memory", "apply", "type", "module", "xpu", "mps",
                  "compile", "prepare", "setup", "setup_module", "wrap"}
_REBUILD_NEW = {"copy.deepcopy", "copy.copy", "pickle.load", "pickle.loads", "torch.load",
                "torch.jit.load", "dill.load", "joblib.load", "cloudpickle.loads"}


class OptimizerOnStaleParams(Rule):
    """## What it does
    Flags rebinding a model name to a different module object (`model = Net()`,
    `copy.deepcopy(model)`, a whole model unpickled with `torch.load`, a new object
    from a factory) after an optimizer was built from `model.parameters()`, when that
    optimizer is stepped afterwards.

    ## Why is this bad?
    The optimizer holds the *old* parameter tensors. The new model's forward and
    backward fill the new tensors' gradients, and `optimizer.step()` updates tensors
    nothing uses any more: the model being trained never changes, no error, flat loss.
    `model = model.to(device)`, `torch.compile(model)`, `DDP(model)` and wrappers that
    keep the model inside share the same parameters and are fine.

    ## Example
    ```python
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model = copy.deepcopy(model)
    for x, y in loader:
        ...
        optimizer.step()
    ```

    ## Use instead
    ```python
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ```
    or load weights in place with `model.load_state_dict(...)`.

    ## References
    - [torch.optim: constructing it](https://pytorch.org/docs/stable/optim.html#constructing-it)
    """

    code = "TL107"
    name = "optimizer-on-stale-params"
    message = "model rebound after its optimizer was built: the optimizer updates the old parameters"
    triggers = ("parameters",)
    confirm_with = "assert_weights_updated"
    valid = [
        """
import torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = model.to("cuda")
model = torch.compile(model)
for x in loader:
    model(x).sum().backward()
    opt.step()
""",
        # the optimizer is rebuilt for the new model
        """
import copy, torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model = copy.deepcopy(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x).sum().backward()
    opt.step()
""",
        # a wrapper that keeps the model inside shares its parameters
        """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
opt = torch.optim.AdamW(model.parameters())
model = DDP(model, device_ids=[0])
model = EMAWrapper(model)
for x in loader:
    model(x).sum().backward()
    opt.step()
""",
        # a copy made for evaluation, optimizer never stepped afterwards
        """
import copy, torch
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in loader:
    model(x).sum().backward()
    opt.step()
best = copy.deepcopy(model)
model = copy.deepcopy(best)
""",
        # no torch
        """
opt = make_optimizer(model.parameters())
model = rebuild(model)
opt.step()
""",
    ]
    invalid = [
        Invalid(
            """
import copy
import torch.optim as optim

optimizer = optim.Adam(model.parameters(), lr=1e-3)
model = copy.deepcopy(model)
for x, y in loader:
    optimizer.zero_grad()
    crit(model(x), y).backward()
    optimizer.step()
""",
            line=5,
        ),
        Invalid(
            """
import torch

def run_fold(cfg, loader):
    model = build_model(cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    for fold in range(5):
        model = build_model(cfg)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
""",
            line=7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        for _, binding in model.roles.all_of(Role.OPTIMIZER):
            call = binding.call
            if call is None:
                continue
            owners = [dotted(o) for o in parameter_owners(call)]
            owners = [o for o in owners if o]
            if not owners:
                continue
            scope = model.function_of(call) or model.tree
            opt_stmt = model.statement_of(call)
            opt_name = self._bound_name(model, opt_stmt)
            if opt_name is None:
                continue
            for stmt in walk_local(scope):
                if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                    continue
                name = dotted(stmt.targets[0])
                if name is None or name not in owners or (stmt.lineno, stmt.col_offset) <= (
                    opt_stmt.lineno, opt_stmt.col_offset
                ):
                    continue  # a rebinding before the optimizer was built is harmless
                if not self._new_object(model, stmt.value, name):
                    continue
                if self._stepped_after(model, scope, stmt, opt_name):
                    yield self.report(stmt)

    @staticmethod
    def _bound_name(model: FileModel, stmt: ast.stmt) -> str | None:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            return dotted(stmt.targets[0])
        return None

    @staticmethod
    def _new_object(model: FileModel, value: ast.AST, name: str) -> bool:
        # `Net().to(device)`: look through pass-through methods to the object they act on
        while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
               and call_name(value) in _REBUILD_KEEPS):
            value = value.func.value
        if not isinstance(value, ast.Call):
            return False
        qual = model.qualname(value.func)
        if qual in _REBUILD_NEW:
            return True
        cname = call_name(value)
        if cname in _REBUILD_KEEPS:
            return False
        if qual is not None and (
            qual in ("torch.compile", "torch.jit.script", "torch.jit.trace")
            or qual.startswith("torch.nn.parallel.")
            or qual.startswith("torch.distributed.")
            or qual == "torch.nn.DataParallel"
        ):
            return False
        # a wrapper/factory that receives the old model keeps its parameters
        for arg in [*value.args, *(k.value for k in value.keywords)]:
            for sub in ast.walk(arg):
                if dotted(sub) == name:
                    return False
        if isinstance(value.func, ast.Attribute) and dotted(value.func.value) == name:
            return False  # model.something(...) returning itself or a view of itself
        return True

    @staticmethod
    def _stepped_after(model: FileModel, scope: ast.AST, stmt: ast.stmt, opt_name: str) -> bool:
        pos = (stmt.lineno, stmt.col_offset)
        rebuilt_at = [
            (s.lineno, s.col_offset) for s in walk_local(scope)
            if isinstance(s, ast.Assign) and any(dotted(t) == opt_name for t in s.targets)
            and (s.lineno, s.col_offset) > pos
        ]
        limit = min(rebuilt_at) if rebuilt_at else (10**9, 0)
        for call in walk_local(scope):
            if not isinstance(call, ast.Call) or call_name(call) not in ("step", "optimizer_step"):
                continue
            func = call.func
            target = None
            if call_name(call) == "step" and isinstance(func, ast.Attribute):
                target = dotted(func.value)
                if target != opt_name and call.args:
                    target = dotted(call.args[0])  # scaler.step(opt)
            elif call.args:
                target = dotted(call.args[0])
            if target == opt_name and pos < (call.lineno, call.col_offset) < limit:
                return True
        # `self.optimizer` built in __init__ and stepped in another method of the class
        if opt_name.startswith("self.") and isinstance(scope, ast.FunctionDef) and (
            scope.name == "__init__" and not rebuilt_at
        ):
            cls = model.class_of(scope)
            if cls is not None:
                for call in ast.walk(cls):
                    if isinstance(call, ast.Call) and call_name(call) == "step" and isinstance(
                        call.func, ast.Attribute
                    ) and dotted(call.func.value) == opt_name and model.function_of(call) is not scope:
                        return True
        return False


class GraphBrokenLoss(Rule):
    """## What it does
    Flags the call that cuts the value reaching `backward()` off the autograd graph:
    `.detach()`, `.data`, `.item()`, `.numpy()`, `.tolist()`, `float(...)`, or a
    `torch.tensor(x, requires_grad=True)` re-wrap of a model output or loss.

    ## Why is this bad?
    Backward then starts from a tensor with no history back to the model: gradients
    never reach the parameters. With a re-wrap (`requires_grad=True`) or another term
    that still has a graph, nothing raises: training runs, the loss is logged, and the
    weights never move. A `.detach()` on a *target* (a DQN target network, a
    distillation teacher) while the trained output keeps its graph is correct and stays
    silent.

    ## Example
    ```python
    loss = criterion(model(x), y)
    loss = torch.tensor(loss.item(), requires_grad=True)
    loss.backward()
    ```

    ## Use instead
    ```python
    loss = criterion(model(x), y)
    loss.backward()
    ```

    ## References
    - [Autograd mechanics](https://pytorch.org/docs/stable/notes/autograd.html)
    """

    code = "TL108"
    name = "graph-broken-loss"
    message = "the value reaching `backward()` was cut from the graph here: no gradient reaches the model"
    triggers = ("backward",)
    confirm_with = "assert_grads_nonzero"
    valid = [
        """
import torch
model = torch.nn.Linear(4, 1)
for x, y in loader:
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    print(loss.item())
""",
        # DQN: the target is detached, the prediction keeps its graph
        """
import torch
policy = Net()
target_net = Net()
for s, a, r, s2 in replay:
    q = policy(s).gather(1, a)
    target = (r + 0.99 * target_net(s2).max(1)[0]).detach()
    loss = torch.nn.functional.smooth_l1_loss(q, target)
    loss.backward()
""",
        # unknown provenance: stay silent
        """
import torch
def step(loss):
    loss = loss.detach() + reg_term()
    loss.backward()
""",
        # no torch
        """
for job in jobs:
    v = job.value.detach()
    v.backward()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
model = torch.nn.Linear(4, 1)
for x, y in loader:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss = torch.tensor(loss.item(), requires_grad=True)
    loss.backward()
""",
            line=5,
        ),
        Invalid(
            """
from torch import nn
import torch.nn.functional as F

class Net(nn.Module):
    pass

net = Net()
for x, y in loader:
    logits = net(x).detach()
    loss = F.cross_entropy(logits, y)
    loss.backward()
""",
            line=9,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.imports_module("torch"):
            return
        flow = model.flow
        seen = Reported()
        for call in backward_calls(model):
            value = backward_value(model, call)
            if value is None:
                continue
            # Each additive term on its own: a term whose every graph source was cut
            # contributes no gradient, even when another term still has a graph.
            for term in flow.terms(value):
                v = flow.value(term)
                if v.taint is Taint.CUT and v.cuts:
                    node = v.cuts[0]
                    if seen.first(node):
                        yield self.report(node)


def _divisor(test: ast.AST) -> ast.AST | None:
    for sub in ast.walk(test):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mod):
            return sub.right
    return None


def _accum_named(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        name = sub.id if isinstance(sub, ast.Name) else sub.attr if isinstance(
            sub, ast.Attribute) else ""
        low = name.lower()
        if "accum" in low or "update_freq" in low or "grad_acc" in low or "iters_to_acc" in low:
            return True
    return False


class UnscaledAccumulatedLoss(Rule):
    """## What it does
    Flags the backward of a gradient-accumulation loop (the optimizer steps under
    `if (i + 1) % accum == 0`) whose loss is not divided by the accumulation count.

    ## Why is this bad?
    Accumulated gradients are the *sum* over `accum` micro-batches, so each update is
    `accum` times larger than the same batch processed at once: the effective learning
    rate is multiplied by the accumulation count. Changing `accum` silently changes the
    optimisation, and large values diverge.

    ## Example
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Use instead
    ```python
    for i, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## References
    - [Gradient accumulation (Hugging Face)](https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation)
    """

    code = "TL109"
    name = "unscaled-accumulated-loss"
    message = "gradient accumulation without dividing the loss by the accumulation count"
    severity = "warning"
    triggers = ("%",)
    valid = [
        """
import torch
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        """
import torch
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss /= args.gradient_accumulation_steps
    loss.backward()
    if (i + 1) % args.gradient_accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
        # a logging guard, not accumulation
        """
import torch
for i, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    if i % 100 == 0:
        print(loss.item())
""",
        # no torch
        """
for i, job in enumerate(jobs):
    job.backward()
    if (i + 1) % 4 == 0:
        job.optimizer.step()
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
""",
            line=4,
        ),
        Invalid(
            """
import torch
import torch.optim as optim
opt = optim.SGD(net.parameters(), lr=0.1)
scaler = torch.amp.GradScaler()
for step, batch in enumerate(loader):
    loss = net(batch).mean()
    scaler.scale(loss).backward()
    if step % 8 == 0:
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
""",
            line=7,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            guards = []
            for step in loop.of(Kind.STEP):
                for g, branch in step.guards:
                    if branch and _divisor(g.test) is not None:
                        guards.append(g)
            if not guards:
                continue
            divisors = [_divisor(g.test) for g in guards]
            if any(isinstance(d, ast.Constant) and d.value in (1, 0) for d in divisors):
                continue
            for bw in loop.of(Kind.BACKWARD):
                if not isinstance(bw.node, ast.Call):
                    continue
                if any(g is guard for g, _ in bw.guards for guard in guards):
                    continue  # backward inside the step branch: no accumulation here
                if self._scaled(model, bw.node, divisors):
                    continue
                node = model.steps.anchor(bw)
                if seen.first(node):
                    yield self.report(node)

    @staticmethod
    def _scaled(model: FileModel, call: ast.Call, divisors: list[ast.AST | None]) -> bool:
        dumps = {ast.dump(d) for d in divisors if d is not None}
        value = backward_value(model, call)
        if value is None:
            return True
        frontier: list[tuple[ast.AST, ast.AST]] = [(value, call)]
        seen: set[int] = set()
        fn = model.function_of(call) or model.tree
        while frontier:
            expr, at = frontier.pop()
            if id(expr) in seen or len(seen) > 50:
                continue
            seen.add(id(expr))
            for sub in ast.walk(expr):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, (ast.Div, ast.Mult)):
                    if ast.dump(sub.right) in dumps or ast.dump(sub.left) in dumps:
                        return True
                    if _accum_named(sub.right) or _accum_named(sub.left):
                        return True
                if isinstance(sub, ast.Call) and (
                    any(ast.dump(a) in dumps for a in sub.args) or any(_accum_named(a) for a in sub.args)
                ):
                    return True  # a helper that knows the accumulation count may scale
                name = dotted(sub) if isinstance(sub, (ast.Name, ast.Attribute)) else None
                if name is not None:
                    found = model.flow.definition(name, at)
                    if found is not None:
                        stmt, val = found
                        frontier.append((val if isinstance(val, ast.AST) else stmt, stmt))
            # `loss /= accum` between definition and backward
        for node in walk_local(fn):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Div, ast.Mult)) and (
                ast.dump(node.value) in dumps or _accum_named(node.value)
            ) and dotted(node.target) == dotted(value):
                return True
        return False


class ClipAfterStep(Rule):
    """## What it does
    Flags gradient clipping (`clip_grad_norm_`/`clip_grad_value_` with a finite bound)
    that runs after the optimizer step of the same iteration, with no later step to use
    the clipped gradients.

    ## Why is this bad?
    The update has already been applied with the unclipped gradients; the clip changes
    gradients that the next `zero_grad()` discards. Training runs unclipped while the
    code says otherwise, and the gradient explosions clipping was meant to stop happen
    anyway. Reading the norm after the step for logging (`max_norm=inf`) is fine.

    ## Example
    ```python
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    ```

    ## Use instead
    ```python
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    ```

    ## References
    - [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
    """

    code = "TL110"
    name = "clip-after-step"
    message = "gradients clipped after the optimizer step: the update already used unclipped gradients"
    triggers = ("clip_grad",)
    confirm_with = "assert_grads_nonzero"
    valid = [
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        # a norm read for logging after the step
        """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
""",
        # GAN: G is clipped after D's step but before its own
        """
import torch
for real in loader:
    d_loss(real).backward()
    opt_d.step()
    g_loss(real).backward()
    torch.nn.utils.clip_grad_norm_(gen.parameters(), 5.0)
    opt_g.step()
""",
        # no torch
        """
for job in jobs:
    job.backward()
    job.opt.step()
    job.clip_grad_norm_(1.0)
""",
    ]
    invalid = [
        Invalid(
            """
import torch
for x, y in loader:
    optimizer.zero_grad()
    criterion(model(x), y).backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
""",
            line=6,
        ),
        Invalid(
            """
from torch.nn.utils import clip_grad_value_ as clip

class Trainer:
    def train_step(self, batch):
        self.opt.zero_grad()
        self.model(batch).mean().backward()
        self.opt.step()
        clip(self.model.parameters(), 0.5)
""",
            line=8,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            for path in loop.paths:
                last_step = -1
                for i, e in enumerate(path):
                    if e.kind is Kind.STEP:
                        last_step = i
                    elif e.kind is Kind.BACKWARD:
                        last_step = -1
                    elif e.kind is Kind.CLIP and last_step >= 0:
                        if any(x.kind is Kind.STEP for x in path[i + 1 :]):
                            continue
                        node = model.steps.anchor(e)
                        if seen.first(node):
                            yield self.report(node)


RULES = [
    GradNormAfterZeroGrad,
    ZeroGradBeforeStep,
    MissingZeroGrad,
    StepBeforeBackward,
    BackwardUnderNoGrad,
    UnregisteredSubmodules,
    OptimizerOnStaleParams,
    GraphBrokenLoss,
    UnscaledAccumulatedLoss,
    ClipAfterStep,
]
