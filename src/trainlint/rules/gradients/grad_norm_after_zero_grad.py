"""TL101 grad-norm-after-zero-grad."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

from trainlint.analysis.model import FileModel
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import Event, Kind
from trainlint.edits import move_next_to
from trainlint.findings import Fix
from trainlint.rules.base import Invalid, Report, Rule
from trainlint.rules.gradients._shared import single_optimizer


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

    ## Fix safety
    The fix moves the statement that reads the gradients (with the `if` or loop around
    it, when the read sits in one of the iteration's blocks) to just before the
    optimizer step that follows this iteration's backward, or before the `zero_grad()`
    when no step lies between. It is unsafe: a clip with a finite bound starts to clip,
    which changes the updates (that is what the code asked for, but the run will differ),
    and calls among the moved statements may depend on state the step changes. It is
    left undone when the read is not in the same block as the step, when a `try`,
    `return`, `break` or `raise` lies between them, or when one side assigns a name the
    other uses.

    ## References
    - [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
    """

    code = "TL101"
    name = "grad-norm-after-zero-grad"
    message = "gradients are read after `zero_grad()` in the same step: the value is always zero; read them between `backward()` and `zero_grad()`"
    triggers = ("grad",)
    fix_safety = "unsafe"
    confirm_with = "assert_clip_effective"
    # tests read gradients after zero_grad() on purpose, to assert that it cleared them
    test_files = False
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
        # micro-batches: the backward in the nested loop refills the gradients
        """
import torch
for batch in loader:
    opt.zero_grad()
    for chunk in batch.split(8):
        (model(chunk).mean() / 4).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
""",
        # the backward under an `if`: the branch that skips it is not judged
        """
import torch
for batch in loader:
    opt.zero_grad()
    if batch is not None:
        loss = model(batch).mean()
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
""",
        # the backward is out of sight (a trainer method from another module, a
        # pipeline schedule): an iteration with no visible backward is not judged
        """
import torch
def train_step(self, samples):
    self.optimizer.zero_grad()
    for sample in samples:
        self.task.train_step(sample, self.model, self.optimizer)
    gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.optimizer.step()
""",
        # hogwild parent: worker processes fill the shared model's gradients
        """
import torch
import torch.multiprocessing as mp
model.share_memory()
for rnd in range(rounds):
    optimizer.zero_grad()
    workers = [mp.Process(target=accumulate, args=(model, shard)) for shard in shards]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
""",
        # an optimizer's own step(): one iteration per parameter group, each reading
        # that group's gradients, writing the flat master gradient, freeing the rest
        """
import torch
class FlatOptimizer(torch.optim.Optimizer):
    def step(self):
        for i, group in enumerate(self.half_groups):
            flat = torch.cat([p.grad.flatten() for p in group])
            self.master[i].grad = flat
            for p in group:
                p.grad = None
        self.inner.step()
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
            fixed="""
import torch
for step, (x, y) in enumerate(loader):
    loss = criterion(model(x), y)
    loss.backward()
    if step % 100 == 0:
        wandb.log({"grad_norm": torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))})
    optimizer.step()
    optimizer.zero_grad()
""",
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
            fixed="""
from torch.nn import utils as U

def grad_norm(model):
    return sum(p.grad.norm() ** 2 for p in model.parameters()) ** 0.5

for epoch in range(3):
    for x, y in loader:
        opt.zero_grad()
        crit(model(x), y).backward()
        log(grad_norm(model))
        opt.step()
        opt.zero_grad()
""",
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
        # micro-batch backward, then the step, then a read after zero_grad
        Invalid(
            """
import torch
for batch in loader:
    for chunk in batch.split(8):
        model(chunk).mean().backward()
    opt.step()
    opt.zero_grad()
    logger.log(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
""",
            line=7,
            fixed="""
import torch
for batch in loader:
    for chunk in batch.split(8):
        model(chunk).mean().backward()
    logger.log(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))
    opt.step()
    opt.zero_grad()
""",
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            if not single_optimizer(loop):
                continue
            end_states = set()
            last_zero = None  # the zero_grad a wrap-around read sees, for the message
            for path in loop.paths:
                last = None
                for e in path:
                    if e.kind in (Kind.BACKWARD, Kind.ZERO):
                        last = e.kind
                        if e.kind is Kind.ZERO:
                            last_zero = e
                end_states.add(last)
            for path in loop.paths:
                # An iteration that zeroes and reads but never visibly backpropagates gets
                # its gradients from something out of sight (a helper in another module,
                # a pipeline schedule, worker processes sharing the model): stay silent.
                if not any(x.kind is Kind.BACKWARD for x in path):
                    continue
                state: Kind | None = None
                zero = last_zero
                for e in path:
                    if e.kind in (Kind.BACKWARD, Kind.ZERO):
                        state = e.kind
                        if e.kind is Kind.ZERO:
                            zero = e
                    elif e.kind in (Kind.READ, Kind.CLIP):
                        # A read at the top of the iteration sees the previous one's
                        # cleared gradients only if iterations repeat a real backward; a
                        # loop over parameter groups that writes `.grad` by hand reads
                        # each group's fresh gradients.
                        zeroed = state is Kind.ZERO or (
                            state is None
                            and end_states == {Kind.ZERO}
                            and any(
                                x.kind is Kind.BACKWARD and isinstance(x.node, ast.Call)
                                for x in path
                            )
                        )
                        if zeroed:
                            node = model.steps.anchor(e)
                            if seen.first(node):
                                related = (
                                    ((model.steps.anchor(zero), "gradients cleared here"),)
                                    if zero is not None
                                    else ()
                                )
                                yield self.report(
                                    node, related=related, fix=self._fix(model, node, path, e)
                                )

    def _fix(
        self, model: FileModel, node: ast.AST, path: Sequence[Event], read: Event
    ) -> Fix | None:
        """Move the read before this iteration's step (or its zero_grad) when it comes
        after a backward and a zero_grad of the same iteration."""
        i = next(k for k, x in enumerate(path) if x is read)
        backward = max((k for k in range(i) if path[k].kind is Kind.BACKWARD), default=-1)
        if backward < 0:
            return None  # a read at the top of the iteration: no place to move it to
        later = path[backward + 1 : i]
        anchor = next(
            (x for x in later if x.kind is Kind.STEP),
            next((x for x in later if x.kind is Kind.ZERO), None),
        )
        if anchor is None:
            return None
        intent = move_next_to(model, node, model.steps.anchor(anchor), "before")
        return self.restructure(intent, "read the gradients before the optimizer step")
