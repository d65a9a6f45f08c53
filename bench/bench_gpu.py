"""What the runtime checks cost on a GPU step, as a ratio to the bare steps they run.

    python bench/bench_gpu.py [--size large|small|both] [--rounds 3] [--steps 10]

A decoder-only transformer step as a nightly "one real step of our model" job runs it:
bf16 autocast, fused AdamW, ``clip_grad_norm_``. ``large`` is ~368M parameters (24
layers, d=1024, batch 8x512), ``small`` ~23M (6 layers, d=384). For each check, rounds of
the bare steps and of the check over as many steps alternate (``--rounds``, in
alternating order); each side is timed by wall clock between two synchronizes, and the
median ratio is reported with its range. Targets (issue 37): 1.05x on the large step,
1.10x on the small one, for the gradient, weight, clip and memory checks.

Without CUDA it says so and exits 0: the CPU costs are bench/bench_runtime.py's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainlint import testing

SIZES = {
    # name: (layers, d_model, heads, vocab, batch, sequence), target
    "large": ((24, 1024, 16, 32000, 8, 512), 1.05),
    "small": ((6, 384, 6, 16000, 8, 512), 1.10),
}


class Decoder(nn.Module):
    def __init__(self, layers: int, d: int, heads: int, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(
            d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=tokens.device)
        return self.head(self.norm(self.blocks(self.embed(tokens), mask=mask, is_causal=True)))


def setup(size: str) -> tuple[nn.Module, Callable[[], torch.Tensor], Any]:
    (layers, d, heads, vocab, batch, seq), _ = SIZES[size]
    torch.manual_seed(0)
    model = Decoder(layers, d, heads, vocab).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    tokens = torch.randint(0, vocab, (batch, seq + 1), device="cuda")
    x, y = tokens[:, :-1], tokens[:, 1:]

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.detach()

    return model, step, optimizer


def checks(model: nn.Module, step: Callable[[], Any], optimizer: Any, steps: int) -> dict:
    warmup = 2
    return {
        "assert_grads_nonzero": lambda: testing.assert_grads_nonzero(model, step, steps=steps),
        "assert_finite_grads": lambda: testing.assert_finite_grads(model, step, steps=steps),
        "assert_finite_grads(locate=False)": lambda: testing.assert_finite_grads(
            model, step, steps=steps, locate=False
        ),
        "assert_weights_updated": lambda: testing.assert_weights_updated(
            model, step, steps=steps, optimizer=optimizer
        ),
        "assert_clip_effective": lambda: testing.assert_clip_effective(model, step, steps=steps),
        "assert_memory_stable": lambda: testing.assert_memory_stable(
            step, steps=steps - warmup, warmup=warmup
        ),
    }


def timed(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("large", "small", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--checks", default="", help="comma-separated names (default: all)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when over a target")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; skipped (CPU costs: bench/bench_runtime.py)")
        return 0
    wanted = {c.strip() for c in args.checks.split(",") if c.strip()}
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, wall time between "
        f"synchronizes, median of {args.rounds} alternating rounds of {args.steps} steps"
    )
    print(f"{'size':<6} {'params':>8} {'bare step':>9}  {'check':<34} {'ratio':>5}  range  target")
    worst = 0.0
    sizes = ("large", "small") if args.size == "both" else (args.size,)
    for size in sizes:
        model, step, optimizer = setup(size)
        n_params = sum(p.numel() for p in model.parameters())
        target = SIZES[size][1]

        def bare(step: Callable[[], Any] = step) -> None:
            for _ in range(args.steps):
                step()

        for _ in range(3):  # compile kernels, fill the allocator's cache, optimizer state
            step()
        for name, check in checks(model, step, optimizer, args.steps).items():
            if wanted and name not in wanted:
                continue
            check()  # warm: the first check traces the step's functions
            ratios, bare_times = [], []
            for i in range(args.rounds):
                if i % 2:
                    b, c = timed(bare), timed(check)
                else:
                    c, b = timed(check), timed(bare)
                ratios.append(c / b)
                bare_times.append(b / args.steps)
            r = statistics.median(ratios)
            worst = max(worst, r / target)
            print(
                f"{size:<6} {n_params / 1e6:>7.1f}M {statistics.median(bare_times) * 1e3:>7.1f}ms"
                f"  {name:<34} {r:>5.2f}x {min(ratios):.2f}-{max(ratios):.2f}  <= {target}x "
                + ("ok" if r <= target else "OVER"),
                flush=True,
            )
        del model, step, optimizer
        torch.cuda.empty_cache()
    return 1 if args.strict and worst > 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
