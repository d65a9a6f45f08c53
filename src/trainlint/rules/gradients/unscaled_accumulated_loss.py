"""TL109 unscaled-accumulated-loss."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, dotted, walk_local
from trainlint.analysis.paths import Reported, precise_step_loops
from trainlint.analysis.steps import Kind, backward_value
from trainlint.rules.base import Invalid, Report, Rule


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
    message = (
        "gradient accumulation without dividing the loss by the accumulation count: each update is that many times larger; divide the loss by it"
    )
    severity = "warning"
    confirm_with = "assert_loss_decreases"
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
