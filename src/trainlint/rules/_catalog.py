"""The built-in rules' metadata, listed so that a check imports no rule module it does not run.

``RULES`` is generated from the rule classes themselves (each rule's code, name, module
and class, and the rest of its metadata where it is not ``Rule``'s default). After adding
a rule or changing a rule's metadata (message, severity, default state, trigger words,
test files, fix safety, options, confirming check), run::

    python -m trainlint.rules._catalog --write

The test suite fails while the list is stale (so does ``--check``, exiting 1).
:func:`trainlint.rules.catalog_rules` makes each entry a stand-in for its rule.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

#: The class attributes listed: what selection, configuration, the engine and the output
#: formats read of a rule before it runs.
FIELDS = (
    "code",
    "name",
    "message",
    "severity",
    "default_enabled",
    "fix_safety",
    "triggers",
    "test_files",
    "options",
    "confirm_with",
)

_BEGIN = "# fmt: off\n"
_END = "# fmt: on\n"

# fmt: off
RULES: tuple[dict[str, Any], ...] = (
    {"code": "TL001", "name": "syntax-error", "module": "trainlint.rules.meta.syntax_error",
     "class": "SyntaxError_", "message": "the file does not parse",
     "options": {"notebook-cells": False}},
    {"code": "TL002", "name": "unused-noqa", "module": "trainlint.rules.meta.unused_noqa",
     "class": "UnusedNoqa", "message": "unused `noqa` directive", "default_enabled": False,
     "fix_safety": "safe"},
    {"code": "TL101", "name": "grad-norm-after-zero-grad",
     "module": "trainlint.rules.gradients.grad_norm_after_zero_grad",
     "class": "GradNormAfterZeroGrad",
     "message": "gradients are read after `zero_grad()` in the same step: the value is always zero; read them between `backward()` and `zero_grad()`",
     "fix_safety": "unsafe", "triggers": ("grad",), "test_files": False,
     "confirm_with": "assert_clip_effective"},
    {"code": "TL102", "name": "zero-grad-before-step",
     "module": "trainlint.rules.gradients.zero_grad_before_step", "class": "ZeroGradBeforeStep",
     "message": "`zero_grad()` between `backward()` and the optimizer step: the step applies no update; call it before the forward pass or after `step()`",
     "fix_safety": "safe", "triggers": ("zero_grad", ".grad"),
     "confirm_with": "assert_weights_updated"},
    {"code": "TL103", "name": "missing-zero-grad",
     "module": "trainlint.rules.gradients.missing_zero_grad", "class": "MissingZeroGrad",
     "message": "no `zero_grad()` on this path of the training loop: gradients accumulate across batches; call `optimizer.zero_grad()` once per step",
     "triggers": ("backward", "step(", "optimizer_step", ".grad"),
     "confirm_with": "assert_loss_decreases"},
    {"code": "TL104", "name": "step-before-backward",
     "module": "trainlint.rules.gradients.step_before_backward", "class": "StepBeforeBackward",
     "message": "the optimizer steps before this iteration's backward: it applies stale gradients; call `step()` after `backward()`",
     "fix_safety": "unsafe", "triggers": ("backward", "step(", "optimizer_step", ".grad"),
     "confirm_with": "assert_weights_updated"},
    {"code": "TL105", "name": "backward-under-no-grad",
     "module": "trainlint.rules.gradients.backward_under_no_grad", "class": "BackwardUnderNoGrad",
     "message": "`backward()` on a value computed without autograd recording (`no_grad`/`inference_mode`): compute the loss outside that block",
     "triggers": ("no_grad", "inference_mode", "set_grad_enabled"),
     "confirm_with": "assert_grads_nonzero"},
    {"code": "TL106", "name": "unregistered-submodules",
     "module": "trainlint.rules.gradients.unregistered_submodules",
     "class": "UnregisteredSubmodules",
     "message": "submodules in a plain container are not registered: invisible to `.parameters()`, `.to()`, `state_dict()`; use `nn.ModuleList`/`nn.ModuleDict`",
     "fix_safety": "safe", "triggers": ("Module",)},
    {"code": "TL107", "name": "optimizer-on-stale-params",
     "module": "trainlint.rules.gradients.optimizer_on_stale_params",
     "class": "OptimizerOnStaleParams",
     "message": "model rebound after its optimizer was built: the optimizer updates the old parameters; build the optimizer from the final model",
     "triggers": ("parameters",), "confirm_with": "assert_weights_updated"},
    {"code": "TL108", "name": "graph-broken-loss",
     "module": "trainlint.rules.gradients.graph_broken_loss", "class": "GraphBrokenLoss",
     "message": "the value reaching `backward()` was cut from the graph here: no gradient reaches the model; backpropagate the tensor itself and log `.item()` separately",
     "triggers": ("backward",), "confirm_with": "assert_grads_nonzero"},
    {"code": "TL109", "name": "unscaled-accumulated-loss",
     "module": "trainlint.rules.gradients.unscaled_accumulated_loss",
     "class": "UnscaledAccumulatedLoss",
     "message": "gradient accumulation without dividing the loss by the accumulation count: each update is that many times larger; divide the loss by it",
     "severity": "warning", "default_enabled": False, "triggers": ("%",),
     "confirm_with": "assert_loss_decreases"},
    {"code": "TL110", "name": "clip-after-step",
     "module": "trainlint.rules.gradients.clip_after_step", "class": "ClipAfterStep",
     "message": "gradients clipped after the optimizer step: the update already used unclipped gradients; clip between `backward()` and `step()`",
     "fix_safety": "safe", "triggers": ("clip_grad",), "confirm_with": "assert_clip_effective"},
    {"code": "TL201", "name": "scheduler-unit-mismatch",
     "module": "trainlint.rules.schedules.scheduler_unit_mismatch",
     "class": "SchedulerUnitMismatch", "message": "scheduler stepped in the wrong unit",
     "triggers": ("lr_scheduler", "Scheduler", "LR(", "LR,", "LR)", "schedule"),
     "confirm_with": "assert_lr_schedule"},
    {"code": "TL202", "name": "scheduler-before-optimizer",
     "module": "trainlint.rules.schedules.scheduler_before_optimizer",
     "class": "SchedulerBeforeOptimizer",
     "message": "`scheduler.step()` before `optimizer.step()`: the schedule's first value is skipped; step the scheduler after the optimizer",
     "fix_safety": "safe", "triggers": ("sched", "lr_scheduler", "Scheduler")},
    {"code": "TL203", "name": "warmup-starts-at-zero",
     "module": "trainlint.rules.schedules.warmup_starts_at_zero", "class": "WarmupStartsAtZero",
     "message": "the LR multiplier is 0 at step 0: the first update uses LR 0; start the warmup above 0, e.g. `(step + 1) / warmup`",
     "triggers": ("LambdaLR", "LinearLR", "_with_warmup"), "test_files": False,
     "confirm_with": "assert_lr_schedule"},
    {"code": "TL204", "name": "scheduler-never-stepped",
     "module": "trainlint.rules.schedules.scheduler_never_stepped",
     "class": "SchedulerNeverStepped",
     "message": "this scheduler is never stepped: the LR stays at its initial value; call `scheduler.step()` in the training loop",
     "triggers": ("lr_scheduler", "LR(", "LR)", "Scheduler", "_schedule"),
     "confirm_with": "assert_lr_schedule"},
    {"code": "TL205", "name": "scheduler-step-with-epoch",
     "module": "trainlint.rules.schedules.scheduler_step_with_epoch",
     "class": "SchedulerStepWithEpoch",
     "message": "`scheduler.step(epoch)` on every batch: the position is set to the epoch index, so the schedule stands still for the whole epoch; call `scheduler.step()` with no argument",
     "severity": "warning", "triggers": ("step(",)},
    {"code": "TL206", "name": "hand-rolled-lr-starts-at-zero",
     "module": "trainlint.rules.schedules.hand_rolled_lr_starts_at_zero",
     "class": "HandRolledLrStartsAtZero",
     "message": "hand-written LR schedule sets the LR to 0 on the first step: the first update does nothing; start the warmup above 0, e.g. `(it + 1) / (warmup + 1)`",
     "triggers": ("param_groups",), "test_files": False, "confirm_with": "assert_weights_updated"},
    {"code": "TL207", "name": "hand-rolled-lr-unit-mismatch",
     "module": "trainlint.rules.schedules.hand_rolled_lr_unit_mismatch",
     "class": "HandRolledLrUnitMismatch",
     "message": "hand-written LR schedule counts in one unit and ends in another",
     "default_enabled": False, "triggers": ("param_groups",), "test_files": False,
     "confirm_with": "assert_lr_schedule"},
    {"code": "TL301", "name": "retain-graph-in-loop",
     "module": "trainlint.rules.memory.retain_graph_in_loop", "class": "RetainGraphInLoop",
     "message": "`retain_graph=True` keeps this batch's saved activations after `backward()` (until the loss is dropped: peak memory doubles, and a kept loss keeps them for good), and no later backward in this step uses them; remove it",
     "fix_safety": "unsafe", "triggers": ("retain_graph",), "confirm_with": "assert_memory_stable"},
    {"code": "TL302", "name": "graph-accumulation",
     "module": "trainlint.rules.memory.graph_accumulation", "class": "GraphAccumulation",
     "message": "a tensor with autograd history is accumulated across iterations: every batch's graph stays alive; accumulate `.detach()` (or `.item()` outside the hot loop)",
     "fix_safety": "unsafe", "triggers": ("+=", "append", "extend", "] =", "]=", " + "),
     "test_files": False, "confirm_with": "assert_memory_stable"},
    {"code": "TL303", "name": "eval-without-no-grad",
     "module": "trainlint.rules.memory.eval_without_no_grad", "class": "EvalWithoutNoGrad",
     "message": "model called during evaluation without `torch.no_grad()`: activations are kept for a backward that never comes; wrap the evaluation in `with torch.no_grad():`",
     "default_enabled": False, "fix_safety": "unsafe", "triggers": ("eval", "valid", "test"),
     "confirm_with": "assert_no_graph_in_eval"},
    {"code": "TL304", "name": "tensor-kept-on-self",
     "module": "trainlint.rules.memory.tensor_kept_on_self", "class": "TensorKeptOnSelf",
     "message": "a tensor with autograd history is kept on an object that outlives the training step: the batch's graph stays alive until it is overwritten; store `.detach()`",
     "triggers": ("self.", "backward"), "confirm_with": "assert_memory_stable"},
    {"code": "TL305", "name": "allocator-call-in-loop",
     "module": "trainlint.rules.memory.allocator_call_in_loop", "class": "AllocatorCallInLoop",
     "message": "allocator/GC call on every training step: costs time and does not fix leaks; remove it or run it every N steps",
     "severity": "warning",
     "triggers": ("empty_cache", "reset_peak_memory_stats", "reset_max_memory", "reset_accumulated_memory_stats", "gc.collect", "collect(")},
    {"code": "TL401", "name": "host-sync-in-loop",
     "module": "trainlint.rules.throughput.host_sync_in_loop", "class": "HostSyncInLoop",
     "message": "host-device sync on every training step: the CPU waits for the GPU queue to drain each batch",
     "default_enabled": False, "triggers": ("backward", "step(", "optimizer_step", ".grad"),
     "options": {"allow-loss-item": True}, "confirm_with": "assert_step_time_stable"},
    {"code": "TL402", "name": "synchronize-in-loop",
     "module": "trainlint.rules.throughput.synchronize_in_loop", "class": "SynchronizeInLoop",
     "message": "device synchronize on every training step: the host waits for the GPU each batch; remove it or run it only when timing",
     "triggers": ("synchronize",), "confirm_with": "assert_step_time_stable"},
    {"code": "TL403", "name": "anomaly-detection-enabled",
     "module": "trainlint.rules.throughput.anomaly_detection_enabled",
     "class": "AnomalyDetectionEnabled",
     "message": "autograd anomaly detection left on: training runs several times slower; enable it only while debugging",
     "triggers": ("anomaly",), "test_files": False},
    {"code": "TL404", "name": "loop-invariant-device-copy",
     "module": "trainlint.rules.throughput.loop_invariant_device_copy",
     "class": "LoopInvariantDeviceCopy",
     "message": "the same tensor is copied to the device on every step: move it once, before the loop",
     "severity": "warning", "triggers": ("backward", "step(", "optimizer_step", ".grad")},
    {"code": "TL405", "name": "loader-starves-gpu",
     "module": "trainlint.rules.throughput.loader_starves_gpu", "class": "LoaderStarvesGpu",
     "message": "the DataLoader loads every batch in the training process (no `num_workers`, no `pin_memory`) while the GPU waits; pass `num_workers=` and `pin_memory=True`",
     "severity": "warning", "default_enabled": False, "triggers": ("DataLoader",),
     "test_files": False},
    {"code": "TL501", "name": "module-sent-to-remote",
     "module": "trainlint.rules.concurrency.module_sent_to_remote", "class": "ModuleSentToRemote",
     "message": "the Ray remote trains a copy of this model; the caller's weights never change",
     "triggers": ("remote", "Trainer"), "confirm_with": "assert_weights_updated"},
    {"code": "TL502", "name": "module-sent-to-process",
     "module": "trainlint.rules.concurrency.module_sent_to_process", "class": "ModuleSentToProcess",
     "message": "the child process may train a copy of this model; the parent's weights may not change",
     "severity": "warning", "triggers": ("Process", "spawn", "Pool", "start_processes"),
     "confirm_with": "assert_weights_updated"},
    {"code": "TL503", "name": "unlocked-shared-model",
     "module": "trainlint.rules.concurrency.unlocked_shared_model", "class": "UnlockedSharedModel",
     "message": "a model shared by several threads is trained without a lock",
     "triggers": ("Thread",), "confirm_with": "assert_thread_safe"},
    {"code": "TL504", "name": "sampler-without-set-epoch",
     "module": "trainlint.rules.concurrency.sampler_without_set_epoch",
     "class": "SamplerWithoutSetEpoch",
     "message": "`DistributedSampler` iterated every epoch without `set_epoch(epoch)`: every epoch sees the same order; call `sampler.set_epoch(epoch)` at the start of each epoch",
     "triggers": ("DistributedSampler",)},
    {"code": "TL505", "name": "loader-without-distributed-sampler",
     "module": "trainlint.rules.concurrency.loader_without_distributed_sampler",
     "class": "LoaderWithoutDistributedSampler",
     "message": "shuffling `DataLoader` in a distributed training loop without a distributed sampler: every rank trains on the whole dataset; pass `sampler=DistributedSampler(dataset)`",
     "triggers": ("Loader",), "confirm_with": "assert_ddp_in_sync"},
    {"code": "TL506", "name": "dataset-rng-copied-to-workers",
     "module": "trainlint.rules.concurrency.dataset_rng_copied_to_workers",
     "class": "DatasetRngCopiedToWorkers",
     "message": "`self.{attr}` is created once and copied into every DataLoader worker (`num_workers` > 0): all workers draw the same random numbers; reseed it per worker in a `worker_init_fn` (`get_worker_info().seed`)",
     "triggers": ("num_workers",)},
    {"code": "TL601", "name": "clip-before-unscale",
     "module": "trainlint.rules.numerics.clip_before_unscale", "class": "ClipBeforeUnscale",
     "message": "gradients clipped before `scaler.unscale_(optimizer)`: the threshold applies to scaled gradients; call `scaler.unscale_(optimizer)` first",
     "fix_safety": "unsafe", "triggers": ("scale(",), "confirm_with": "assert_clip_effective"},
    {"code": "TL602", "name": "softmax-into-cross-entropy",
     "module": "trainlint.rules.numerics.softmax_into_cross_entropy",
     "class": "SoftmaxIntoCrossEntropy",
     "message": "softmax output fed to cross-entropy, which applies log-softmax itself: a double softmax; pass the logits",
     "triggers": ("softmax", "Softmax"), "confirm_with": "assert_loss_decreases"},
    {"code": "TL603", "name": "backward-inside-autocast",
     "module": "trainlint.rules.numerics.backward_inside_autocast",
     "class": "BackwardInsideAutocast",
     "message": "`backward()` inside an `autocast` region: autocast should wrap only the forward pass and loss; move `backward()` out of the block",
     "severity": "warning", "fix_safety": "safe", "triggers": ("autocast",),
     "confirm_with": "assert_finite_grads"},
    {"code": "TL604", "name": "scaler-step-bypassed",
     "module": "trainlint.rules.numerics.scaler_step_bypassed", "class": "ScalerStepBypassed",
     "message": "gradients from `scaler.scale(loss).backward()` applied by `optimizer.step()`: no unscaling, no inf/NaN check; use `scaler.step(optimizer)`",
     "triggers": ("scale(", "GradScaler"), "confirm_with": "assert_finite_grads"},
    {"code": "TL605", "name": "sigmoid-into-bce-with-logits",
     "module": "trainlint.rules.numerics.sigmoid_into_bce_with_logits",
     "class": "SigmoidIntoBceWithLogits",
     "message": "sigmoid output fed to a loss that applies the sigmoid itself: a double sigmoid; pass the logits",
     "triggers": ("_with_logits", "BCEWithLogits", "sigmoid_focal_loss", "BCELoss", "binary_cross_entropy"),
     "confirm_with": "assert_loss_decreases"},
    {"code": "TL701", "name": "eval-mode-not-restored",
     "module": "trainlint.rules.state.eval_mode_not_restored", "class": "EvalModeNotRestored",
     "message": "`eval()` in the training loop and no `train()` before the next training step: dropout and batch norm stay in eval mode; call `.train()` after evaluating",
     "fix_safety": "safe", "triggers": ("eval(",)},
    {"code": "TL702", "name": "unsafe-torch-load",
     "module": "trainlint.rules.state.unsafe_torch_load", "class": "UnsafeTorchLoad",
     "message": "`torch.load(weights_only=False)` unpickles arbitrary code from this file",
     "default_enabled": False, "fix_safety": "unsafe", "triggers": ("load",), "test_files": False,
     "options": {"require-explicit": True, "report-explicit-false": False, "target-torch": None}},
    {"code": "TL703", "name": "unseeded-reproducibility",
     "module": "trainlint.rules.state.unseeded_reproducibility", "class": "UnseededReproducibility",
     "message": "deterministic algorithms are requested but nothing seeds the random generators: runs still differ; seed torch (and numpy/random if used)",
     "severity": "warning", "default_enabled": False, "triggers": ("deterministic", "seed"),
     "test_files": False},
    {"code": "TL704", "name": "checkpoint-needs-pickle",
     "module": "trainlint.rules.state.checkpoint_needs_pickle", "class": "CheckpointNeedsPickle",
     "message": "this checkpoint holds objects `weights_only` refuses: since torch 2.6 the bare `torch.load` raises `UnpicklingError`; pass `weights_only=False` for the project's own checkpoints",
     "fix_safety": "unsafe", "triggers": ("load",), "test_files": False,
     "options": {"target-torch": None}},
)
# fmt: on


def _literal(value: Any) -> str:
    """``value`` as Python source (strings in double quotes where that needs no escape)."""
    if isinstance(value, str):
        text = repr(value)
        if text.startswith("'") and '"' not in value:
            text = '"' + text[1:-1] + '"'
        return text
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, tuple):
        items = [_literal(v) for v in value]
        return "(" + (items[0] + "," if len(items) == 1 else ", ".join(items)) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot list {value!r} in the rule catalog: use literals")


def render() -> str:
    """The generated part of this module, from the built-in rule classes: each rule's
    code, name, module and class, and its other metadata where it is not ``Rule``'s
    default (a stand-in inherits those)."""
    from trainlint.rules import builtin_rules
    from trainlint.rules.base import Rule

    lines = [_BEGIN.rstrip("\n"), "RULES: tuple[dict[str, Any], ...] = ("]
    for rule in builtin_rules():
        items = [
            f'"code": {_literal(rule.code)}',
            f'"name": {_literal(rule.name)}',
            f'"module": {_literal(rule.__module__)}',
            f'"class": {_literal(rule.__qualname__)}',
        ]
        for attr in FIELDS:
            value = getattr(rule, attr)
            if attr not in ("code", "name") and (
                not hasattr(Rule, attr) or value != getattr(Rule, attr)
            ):
                items.append(f"{_literal(attr)}: {_literal(value)}")
        lines.extend(_wrap(items))
    lines.extend([")", _END])
    return "\n".join(lines)


def _wrap(items: list[str]) -> list[str]:
    """One dict literal of ``items`` over lines of up to 100 characters where they fit."""
    lines: list[str] = []
    line = "    {"
    for i, item in enumerate(items):
        piece = item + ("}," if i == len(items) - 1 else ",")
        if line == "    {":
            line += piece
        elif len(line) + 1 + len(piece) <= 100:
            line += " " + piece
        else:
            lines.append(line)
            line = "     " + piece
    lines.append(line)
    return lines


def _split(text: str) -> tuple[str, str, str]:
    """This module's text as (before, generated part, after)."""
    start = text.index("\n" + _BEGIN) + 1
    end = text.index(_END, start) + len(_END)
    return text[:start], text[start:end], text[end:]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(__file__)
    text = path.read_text(encoding="utf-8")
    before, current, after = _split(text)
    fresh = render()
    if "--write" in argv:
        if fresh != current:
            path.write_text(before + fresh + after, encoding="utf-8")
            print(f"wrote {path}")
        return 0
    if fresh != current:
        print(f"stale: {path}: run `python -m trainlint.rules._catalog --write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
