"""TL401 host-sync-in-loop."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from trainlint.analysis.model import FileModel, call_name
from trainlint.analysis.steps import STEP_LOOP_TRIGGERS
from trainlint.analysis.syncs import HostSync, into_tensor, per_item, per_step_syncs
from trainlint.rules.base import Report, Rule
from trainlint.rules.throughput._host_sync_in_loop_examples import INVALID, VALID

_COST = "the CPU waits for the GPU queue to drain each batch"


class HostSyncInLoop(Rule):
    """## What it does
    Flags host-device synchronisations on every step of a training loop that cost
    throughput for nothing: a number read to the host only to be added back into a
    device tensor (`counts += x.sum().item()`), the same value read twice in a step,
    copies of whole tensors (`.cpu()`, `.cpu().numpy()`, `.tolist()` of a batch of
    predictions), and tensors formatted by `print(t)` or an f-string. Calls under a
    rate-limiting `if` (`step % N == 0`, a logging/main-process guard), after an early
    `return`/`continue` on such a guard, after the loop, and in validation loops are
    fine; so is an action copied to NumPy for `env.step(...)`, which needs host data.
    Reads in the branch of a loop that serves both phases where the phase is not the
    training one (`if phase == "val":` while backward runs under `phase == "train"`)
    are validation, and a script that never names a device (no `.cuda()`,
    `.to(device)`, `device=`, nor a framework that places the model) reads from the CPU
    and waits for nothing; a step method that other files call may get device tensors
    from them, so it is still checked. A read per item of a step's tensor (`for out in outputs: out.item()`) is
    one sync per sample and is reported even where one read per step is allowed.

    By default one read per step of each scalar that is only logged (`loss.item()`,
    `float(loss)`, `f"{loss:.4f}"`, `ent_coef.item()`, `loss.detach().cpu()`,
    `kl.mean().cpu()`) is
    accepted: it costs one sync per step, and reviewed training code does it on purpose
    almost everywhere. Set `allow-loss-item = false` to flag those too.

    ## Why is this bad?
    CUDA runs asynchronously: the Python loop normally queues the next batch's kernels
    while the GPU works. Reading a value on the host forces the CPU to wait until the
    queue drains, every step. When the host and the GPU take about as long per step,
    throughput drops by up to half, and nothing reports it. A read whose number goes
    straight back into a tensor, or formats a whole tensor, buys nothing for that wait.

    ## Example
    ```python
    tokens = torch.zeros((), device="cuda", dtype=torch.long)
    for batch in loader:
        ...
        loss.backward()
        optimizer.step()
        tokens += batch["mask"].sum().item()
        print("loss", loss)
    ```

    ## Use instead
    ```python
    tokens = torch.zeros((), device="cuda", dtype=torch.long)
    for step, batch in enumerate(loader):
        ...
        loss.backward()
        optimizer.step()
        tokens += batch["mask"].sum()
        if step % args.log_interval == 0:
            print(f"loss {loss.item():.4f}")
    ```

    ## Why is this off by default?
    Reviewed on real training code, most per-step host reads are deliberate: per-step
    progress bars and metric lists, RL statistics, an algorithm that needs the number on
    the host (a TRPO line search, early stopping on KL), a second read after the queue
    has drained, which waits for nothing. On the research corpus of GitHub training
    repositories 2 of 38 findings were worth changing, and still only 2 of 18 after the
    rule learned validation branches, CPU-only scripts and number formats of the loss:
    far below the 0.9 precision a default rule needs (on 28 published training
    libraries 10 of 11 hold, nearly all in one package). Turn it on for a
    throughput-critical loop with `--extend-select TL401`, and confirm a suspicion with
    `assert_step_time_stable`.

    ## Options
    - `allow-loss-item` (default `true`): accept one read per step of each scalar that
      is only logged: the loss, its parts, a metric. Set it to `false` to flag every
      per-step read, for a throughput-critical loop where even one sync per step
      matters (then also accumulate the loss with `.detach()` and read it every N
      steps).

    ## References
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    - [torch.cuda.set_sync_debug_mode](https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
    """

    code = "TL401"
    name = "host-sync-in-loop"
    default_enabled = False
    message = f"host-device sync on every training step: {_COST}"
    triggers = STEP_LOOP_TRIGGERS
    options = {"allow-loss-item": True}
    confirm_with = "assert_step_time_stable"
    valid = VALID
    invalid = INVALID

    def check(self, model: FileModel) -> Iterator[Report]:
        if not model.steps.step_loops:
            return
        allow_scalars = bool(self.opts.get("allow-loss-item"))
        read: set[tuple[int, tuple[str, int]]] = set()
        reported: set[int] = set()
        for sync, loop, anchor in per_step_syncs(model):
            message = None
            if sync.kind == "scalar":
                again = sync.value is not None and (id(loop.node), sync.value) in read
                if sync.value is not None:
                    read.add((id(loop.node), sync.value))
                if into_tensor(model, sync.node):
                    message = (
                        f"{sync.what} on every training step only to add the number back "
                        f"into a device tensor: {_COST} for nothing; drop the read and "
                        "keep the sum on the device"
                    )
                elif again:
                    message = (
                        f"{sync.what} of `{sync.key}` a second time in the step: each read "
                        "waits for the GPU queue; read it once and reuse the number"
                    )
                elif allow_scalars and not per_item(model, sync.node, loop.node):
                    continue
            stmt = model.statement_of(anchor)
            if id(stmt) in reported:
                continue
            reported.add(id(stmt))
            if message is None and per_item(model, sync.node, loop.node):
                message = (
                    f"{sync.what} for each item of a step's tensor: one wait for the GPU "
                    "queue per sample, many per step; compute on the device over the "
                    "whole batch and read once"
                )
            yield self.report(anchor, message or self._message(model, sync, anchor))

    @staticmethod
    def _message(model: FileModel, sync: HostSync, anchor: ast.AST) -> str:
        where = ""
        if anchor is not sync.node and isinstance(anchor, ast.Call):
            helper = call_name(anchor)
            where = f" (in `{helper}()`)" if helper else ""
        if sync.kind == "format":
            return (
                f"{sync.what}{where} on every training step: formatting reads the tensor "
                f"from the GPU, so {_COST}; log a number read every N steps"
            )
        return (
            f"{sync.what}{where} on every training step: {_COST}; keep the value on "
            "the device or read it every N steps"
        )
