"""TL109 unscaled-accumulated-loss."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.grad_accumulation import (
    accumulation_divisor_at,
    cleared_before_backward,
    divided_by_callers,
    lr_divided_by_count,
    names_accumulation_count,
    rescales_grads,
)
from trainlint.analysis.model import FileModel, dotted, walk_local
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import Event, Kind, StepLoop, backward_value
from trainlint.rules.base import Invalid, Report, Rule


def _under(event: Event, guards: list[ast.If]) -> bool:
    return any(g is guard for g, _ in event.guards for guard in guards)


def _consumed_each_iteration(
    loop: StepLoop, bw: Event, guards: list[ast.If], guarded: set[str | None], single: bool
) -> bool:
    """On every path, this backward's gradients are cleared before it or applied after it
    by an unguarded step: only another optimizer's update is delayed (TD3's actor, a GAN
    critic loop), nothing accumulates."""
    containing = [p for p in loop.paths if any(e is bw for e in p)]
    if not containing:
        return False
    for path in containing:
        i = next(k for k, e in enumerate(path) if e is bw)
        cleared = any(
            e.kind is Kind.ZERO
            and not _under(e, guards)
            and (single or e.target is None or e.target in guarded)
            for e in path[:i]
        )
        nxt = next((e for e in path[i + 1 :] if e.kind is Kind.STEP), None)
        applied = nxt is not None and not _under(nxt, guards)
        if not (cleared or applied):
            return False
    return True


class UnscaledAccumulatedLoss(Rule):
    """## What it does
    Flags the backward of a gradient-accumulation loop (the optimizer steps under
    `if (i + 1) % accum == 0`) whose loss is not divided by the accumulation count.
    Not reported when the step branch divides the summed gradients itself
    (`scale_grads(model, 1 / n)`, `p.grad.div_(n)`), when the learning rate is already
    divided by the count, or when that backward's gradients are zeroed or stepped on
    every iteration anyway and only another optimizer waits for the counter (a delayed
    actor update, a GAN critic loop).

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

    ## Why is this off by default?
    The learning rate is multiplied only for optimizers whose update scales with the
    gradient (SGD and its momentum forms). Adam, AdamW, RMSprop and Adagrad divide the
    gradient by its own running magnitude, so a constant factor mostly cancels; on
    research training code 5 of 6 findings were such loops, with the optimizer built
    in another file. Select it where SGD-family optimizers accumulate gradients.

    ## References
    - [Gradient accumulation (Hugging Face)](https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation)
    """

    code = "TL109"
    name = "unscaled-accumulated-loss"
    message = "gradient accumulation without dividing the loss by the accumulation count: each update is that many times larger; divide the loss by it"
    severity = "warning"
    confirm_with = "assert_loss_decreases"
    triggers = ("%",)
    default_enabled = False
    valid = [
        # the guarded zero_grad runs before the backward: each update uses one batch
        """
import torch
for j, (x, y) in enumerate(loader):
    loss = torch.nn.functional.mse_loss(model(x), y)
    if (j + 1) % accum == 0:
        optimizer.zero_grad()
    loss.backward()
    if (j + 1) % accum == 0:
        optimizer.step()
""",
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
        # delayed policy update (TD3): the critic is zeroed and stepped every
        # iteration, only the actor's update waits for the counter
        """
import torch
for step in range(total_steps):
    critic_loss = critic_loss_fn(batch)
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    if step % policy_delay == 0:
        actor_loss = -critic(obs, actor(obs)).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
""",
        # WGAN: the critic trains on every batch, the generator every n_critic batches
        """
import torch
for i, real in enumerate(loader):
    opt_d.zero_grad()
    d_loss = disc(gen(noise())).mean() - disc(real).mean()
    d_loss.backward()
    opt_d.step()
    if i % n_critic == 0:
        opt_g.zero_grad()
        g_loss = -disc(gen(noise())).mean()
        g_loss.backward()
        opt_g.step()
""",
        # token-weighted losses summed, then the gradients divided by the token total
        """
import torch
for idx, batch in enumerate(loader):
    loss = loss_fn(model(batch["tokens"]), batch["labels"]) * batch["num_tokens"]
    num_tokens += batch["num_tokens"]
    loss.backward()
    if (idx + 1) % grad_accum_steps == 0:
        scale_grads(model, 1 / num_tokens)
        optimizer.step()
        optimizer.zero_grad()
        num_tokens = 0
""",
        # the gradients divided in place before the step
        """
import torch
for i, (x, y) in enumerate(loader):
    criterion(model(x), y).backward()
    if (i + 1) % accum == 0:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(accum)
        optimizer.step()
        optimizer.zero_grad()
""",
        # the learning rate already divided by the accumulation count
        """
import torch
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr / args.accumulation_steps)
for i, (x, y) in enumerate(loader):
    criterion(model(x), y).backward()
    if (i + 1) % args.accumulation_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
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
        # two optimizers: D steps every batch, G accumulates unscaled losses
        Invalid(
            """
import torch
for i, real in enumerate(loader):
    opt_d.zero_grad()
    disc_loss(real).backward()
    opt_d.step()
    gen_loss(real).backward()
    if (i + 1) % accum == 0:
        opt_g.step()
        opt_g.zero_grad()
""",
            line=6,
        ),
    ]

    def check(self, model: FileModel) -> Iterator[Report]:
        seen = Reported()
        for loop in precise_step_loops(model):
            guards = []
            for step in loop.of(Kind.STEP):
                for g, branch in step.guards:
                    if branch and accumulation_divisor_at(model, g.test) is not None:
                        guards.append(g)
            if not guards:
                continue
            divisors = [accumulation_divisor_at(model, g.test) for g in guards]
            if any(isinstance(d, ast.Constant) and d.value in (1, 0) for d in divisors):
                continue
            if any(rescales_grads(model, g) for g in guards) or lr_divided_by_count(
                model, divisors
            ):
                continue  # the sum is divided afterwards, or the LR already accounts for it
            guarded = {t for s in loop.of(Kind.STEP) if _under(s, guards) for t in [s.target]}
            single = len(loop.targets(Kind.STEP)) <= 1
            for bw in loop.of(Kind.BACKWARD):
                if not isinstance(bw.node, ast.Call):
                    continue
                if _under(bw, guards):
                    continue  # backward inside the step branch: no accumulation here
                if _consumed_each_iteration(loop, bw, guards, guarded, single):
                    continue
                if cleared_before_backward(loop.paths, bw, [d for d in divisors if d is not None]):
                    continue  # the guarded zero_grad wipes the sum before the step's backward
                if self._scaled(model, bw.node, divisors):
                    continue
                node = model.steps.anchor(bw)
                if seen.first(node):
                    yield self.report(node)

    @staticmethod
    def _scaled(model: FileModel, call: ast.Call, divisors: list[ast.AST | None]) -> bool:
        dumps = {ast.dump(d) for d in divisors if d is not None}
        value = backward_value(model, call)
        if value is None or divided_by_callers(model, call, value, [d for d in divisors if d]):
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
                    if names_accumulation_count(sub.right) or names_accumulation_count(sub.left):
                        return True
                if isinstance(sub, ast.Call) and (
                    any(ast.dump(a) in dumps for a in sub.args)
                    or any(names_accumulation_count(a) for a in sub.args)
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
            if (
                isinstance(node, ast.AugAssign)
                and isinstance(node.op, (ast.Div, ast.Mult))
                and (ast.dump(node.value) in dumps or names_accumulation_count(node.value))
                and dotted(node.target) == dotted(value)
            ):
                return True
        return False
