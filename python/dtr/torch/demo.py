"""``python -m dtr.torch.demo``: train a small model unbounded and under half its peak.

Prints both peaks, the slowdown, and whether every loss and gradient is
bitwise equal. Runs on the CPU in a few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch

import dtr
import dtr.torch


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = []
    for _ in range(16):
        blocks += [torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Dropout(0.1)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(256, 10))


def train(model: torch.nn.Module, steps: int, limit, heuristic: str = "dtr"):
    """Trains a copy of `model` (`limit="stock"`: without dtr) under
    `heuristic`; returns (losses, gradients, seconds, session)."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1)
    losses, grads = [], []
    torch.manual_seed(2)
    start = time.perf_counter()
    session = dtr.torch.budget(limit, heuristic=heuristic) if limit != "stock" else None
    with session if session is not None else contextlib.nullcontext():
        for _ in range(steps):
            x = torch.randn(2048, 256, generator=generator)
            y = torch.randint(0, 10, (2048,), generator=generator)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return losses, grads, time.perf_counter() - start, session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--ratio", type=float, default=0.5, help="budget as a fraction of the peak")
    parser.add_argument("--heuristic", default="dtr")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if not 0 < args.ratio <= 1:
        parser.error(f"--ratio must be a fraction of the peak in (0, 1], got {args.ratio}")
    if args.heuristic not in dict(dtr.heuristics()):
        parser.error(f"unknown heuristic {args.heuristic!r}; known: "
                     f"{', '.join(name for name, _ in dtr.heuristics())}")
    model = make_model()
    train(model, 1, None)  # warm up PyTorch's kernels and dispatch caches
    losses, grads, seconds, _ = train(model, args.steps, "stock")
    peak = train(model, args.steps, None)[3].stats()["peak_bytes"]
    budget = int(peak * args.ratio)
    try:
        dtr_losses, dtr_grads, dtr_seconds, dtr_session = train(
            model, args.steps, budget, args.heuristic)
    except dtr.OutOfMemory as error:
        raise SystemExit(f"under {args.ratio} of the peak: {error}") from None
    stats = dtr_session.stats()
    identical = losses == dtr_losses and all(
        (a == b).all() for step_a, step_b in zip(grads, dtr_grads) for a, b in zip(step_a, step_b))
    mib = 2**20
    print(f"stock PyTorch:    peak {peak / mib:7.1f} MiB (tracked by dtr.torch.budget(None)), "
          f"{seconds / args.steps:.3f} s/step")
    print(f"budget {args.ratio:.2f}x peak: peak {stats['peak_bytes'] / mib:7.1f} MiB "
          f"(budget {budget / mib:.1f} MiB), {dtr_seconds / args.steps:.3f} s/step, "
          f"slowdown {dtr_seconds / seconds:.2f}x")
    print(f"evictions {stats['evictions']}, rematerializations {stats['rematerializations']}, "
          f"heuristic {stats['heuristic']}")
    print("losses:", " ".join(f"{v:.6f}" for v in dtr_losses))
    print("losses and gradients bitwise identical:", "yes" if identical else "NO")
    if not identical or stats["peak_bytes"] > budget:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
