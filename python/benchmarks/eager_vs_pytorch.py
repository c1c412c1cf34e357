"""dtr's eager examples on its CPU backend against the same models in PyTorch.

For each of the `mlp`, `transformer` and `resnet` examples (`examples/*.rs`)
this runs the Rust example as a subprocess (`--backend cpu --json`: one
unbounded run, then one under 0.5 of that run's peak memory) and the same
model written in PyTorch (same shapes, initial value ranges, optimiser,
learning rate, data distribution and step count, `torch.set_num_threads(N)`),
then prints steps per second for both and their ratio, and dtr under
0.5 × peak against its own unbounded run.

A step's time is measured from the end of the previous step. A run's step
time is the median over its steps after the first (which also builds the
model and data), for both frameworks; each configuration runs `--repeat`
times in fresh processes, alternating between the frameworks, and the fastest
run counts, which damps noise from other work on the host (the header prints
the load average). PyTorch's OpenMP threads spin while they wait by default;
on a host shared with other work, `OMP_WAIT_POLICY=PASSIVE` in the
environment (passed through) keeps them from starving each other.

    cargo build --release --examples
    python python/benchmarks/eager_vs_pytorch.py --threads 2 --steps 10

On a machine with a GPU, `--backend wgpu` runs the examples on dtr's wgpu
backend and PyTorch on CUDA (`--torch-device` overrides; each PyTorch step
ends with `torch.cuda.synchronize()`, as each dtr step ends by reading its
loss):

    python python/benchmarks/eager_vs_pytorch.py --backend wgpu

Needs PyTorch (CPU is enough); nothing is installed by this script.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = ("mlp", "transformer", "resnet")


def steady_step_seconds(step_seconds: list[float]) -> float:
    """Median step time without the first step (model and data setup, warm-up)."""
    rest = sorted(step_seconds[1:] or step_seconds)
    middle = len(rest) // 2
    return rest[middle] if len(rest) % 2 else (rest[middle - 1] + rest[middle]) / 2


# ---------------------------------------------------------------- dtr side


def run_dtr(model: str, backend: str, threads: int, steps: int, budget_ratio: float) -> dict:
    binary = REPO / "target" / "release" / "examples" / model
    if not binary.exists():
        sys.exit(f"{binary} is missing: run `cargo build --release --examples` first")
    command = [
        str(binary),
        "--backend", backend,
        "--threads", str(threads),
        "--steps", str(steps),
        "--budget-ratio", str(budget_ratio),
        "--json",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if not done.stdout.strip():
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr}")
    report = json.loads(done.stdout)
    return {
        "unbounded": steady_step_seconds(report["baseline_step_seconds"]),
        "budgeted": steady_step_seconds(report["step_seconds"]),
        "losses": report["baseline_losses"],
        "losses_match": report["losses_match"],
        "evictions": report["evictions"],
        "rematerializations": report["rematerializations"],
        "peak_mib": report["baseline_peak_bytes"] / 2**20,
    }


# ------------------------------------------------------------ PyTorch side
# Each model mirrors its example: the same layer sizes, activations, loss,
# optimiser and learning rate, and the same initial value ranges (dtr's
# `nn` module: weights uniform in ±sqrt(6 / fan_in), zero biases, layer-norm
# scale 1 and shift 0, embeddings uniform in ±0.1). Random draws differ
# (different generators), so losses agree only roughly.


def torch_mlp(torch, device, steps: int, laps: list[float]) -> list[float]:
    nn, F = torch.nn, torch.nn.functional
    batch, features, hidden, layers, classes, lr = 1024, 64, 128, 12, 10, 0.1
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, features, generator=g) * 2 - 1
    teacher = torch.rand(features, classes, generator=g) * 2 - 1
    y = (x @ teacher).argmax(dim=1)
    widths = [features] + [hidden] * (layers - 1) + [classes]
    linears = [nn.Linear(a, b) for a, b in zip(widths, widths[1:])]
    with torch.no_grad():
        for linear in linears:
            bound = math.sqrt(6.0 / linear.in_features)
            linear.weight.uniform_(-bound, bound, generator=g)
            linear.bias.zero_()
    stack = []
    for i, linear in enumerate(linears):
        stack.append(linear)
        if i + 1 < len(linears):
            stack.append(nn.ReLU())
    model = nn.Sequential(*stack).to(device)
    x, y = x.to(device), y.to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        losses.append(loss.item())
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        lap(torch, device, laps)
    return losses


def torch_transformer(torch, device, steps: int, laps: list[float]) -> list[float]:
    nn, F = torch.nn, torch.nn.functional
    b, t, v, d, heads, blocks, lr = 16, 64, 64, 32, 4, 4, 3e-3
    g = torch.Generator().manual_seed(0)

    def linear(inputs: int, outputs: int) -> nn.Linear:
        layer = nn.Linear(inputs, outputs)
        with torch.no_grad():
            bound = math.sqrt(6.0 / inputs)
            layer.weight.uniform_(-bound, bound, generator=g)
            layer.bias.zero_()
        return layer

    class Block(nn.Module):
        """Pre-norm: x + attn(ln(x)), then x + down(gelu(up(ln(x))))."""

        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.query, self.key, self.value, self.output = (linear(d, d) for _ in range(4))
            self.up, self.down = linear(d, 4 * d), linear(4 * d, d)

        def attention(self, x, mask):
            split = lambda y: y.reshape(b, t, heads, d // heads).transpose(1, 2)
            q, k, v_ = split(self.query(x)), split(self.key(x)), split(self.value(x))
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d // heads)) + mask
            attended = scores.softmax(-1) @ v_
            return self.output(attended.transpose(1, 2).reshape(b, t, d))

        def forward(self, x, mask):
            x = x + self.attention(self.norm1(x), mask)
            return x + self.down(F.gelu(self.up(self.norm2(x)), approximate="tanh"))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(v, d), nn.Embedding(t, d)
            with torch.no_grad():
                self.tokens.weight.uniform_(-0.1, 0.1, generator=g)
                self.positions.weight.uniform_(-0.1, 0.1, generator=g)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.norm = nn.LayerNorm(d)
            self.head = linear(d, v)

        def forward(self, x, position_ids, mask):
            h = self.tokens(x) + self.positions(position_ids)
            for block in self.blocks:
                h = block(h, mask)
            return self.head(self.norm(h)).reshape(b * t, v)

    model = Decoder().to(device)
    adam = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
    above = torch.ones(t, t).triu(1).bool()
    mask = torch.zeros(t, t).masked_fill(above, -1e9).to(device)
    position_ids = torch.arange(t).repeat(b, 1).to(device)
    losses = []
    for _ in range(steps):
        # Sequences counting up by a random stride from a random start.
        start = torch.randint(0, v, (b, 1), generator=g)
        stride = torch.randint(1, 4, (b, 1), generator=g)
        i = torch.arange(t + 1)
        stream = (start + i * stride) % v
        x, y = stream[:, :t].to(device), stream[:, 1:].reshape(b * t).to(device)
        loss = F.cross_entropy(model(x, position_ids, mask), y)
        losses.append(loss.item())
        adam.zero_grad()
        loss.backward()
        adam.step()
        lap(torch, device, laps)
    return losses


def torch_resnet(torch, device, steps: int, laps: list[float]) -> list[float]:
    nn, F = torch.nn, torch.nn.functional
    n, width, per_stage, side, classes, lr = 8, 8, 5, 32, 10, 0.05
    g = torch.Generator().manual_seed(0)

    def conv(inputs: int, outputs: int, stride: int) -> nn.Conv2d:
        layer = nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1)
        with torch.no_grad():
            bound = math.sqrt(6.0 / (inputs * 9))
            layer.weight.uniform_(-bound, bound, generator=g)
            layer.bias.zero_()
        return layer

    class Block(nn.Module):
        """relu(x + 0.5 · conv(relu(conv(x)))), a strided 3×3 projection when downsampling."""

        def __init__(self, inputs: int, outputs: int, stride: int):
            super().__init__()
            self.first = conv(inputs, outputs, stride)
            self.second = conv(outputs, outputs, 1)
            self.shortcut = conv(inputs, outputs, 2) if stride == 2 else None

        def forward(self, x):
            h = self.second(F.relu(self.first(x))) * 0.5
            skip = self.shortcut(x) if self.shortcut is not None else x
            return F.relu(h + skip)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(3, width, 1)
            layers, channels = [], width
            for stage in range(3):
                for i in range(per_stage):
                    down = stage > 0 and i == 0
                    outputs = channels * 2 if down else channels
                    layers.append(Block(channels, outputs, 2 if down else 1))
                    channels = outputs
            self.blocks = nn.Sequential(*layers)
            self.channels = channels
            self.head = nn.Linear(channels, classes)
            with torch.no_grad():
                bound = math.sqrt(6.0 / channels)
                self.head.weight.uniform_(-bound, bound, generator=g)
                self.head.bias.zero_()

        def forward(self, x):
            h = self.blocks(F.relu(self.stem(x)))
            final = math.ceil(side / 4)
            pooled = F.avg_pool2d(h, final, stride=final).reshape(n, self.channels)
            return self.head(pooled)

    model = ResNet().to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=lr)
    templates = torch.rand(classes, 3, side, side, generator=g) * 2 - 1
    losses = []
    for _ in range(steps):
        labels = torch.randint(0, classes, (n,), generator=g)
        images = templates[labels] + (torch.rand(n, 3, side, side, generator=g) - 0.5)
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        losses.append(loss.item())
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        lap(torch, device, laps)
    return losses


def lap(torch, device, laps: list[float]) -> None:
    """Marks the end of a step, once the device has finished it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    laps.append(time.perf_counter())


TORCH_MODELS = {"mlp": torch_mlp, "transformer": torch_transformer, "resnet": torch_resnet}


def torch_worker(model: str, device: str, threads: int, steps: int) -> None:
    """Runs one PyTorch model in this (fresh) process and prints JSON."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("PyTorch sees no CUDA device (use --torch-device cpu to compare with "
                 "PyTorch on the CPU)")
    torch.set_num_threads(threads)
    started = time.perf_counter()
    laps: list[float] = []
    losses = TORCH_MODELS[model](torch, torch.device(device), steps, laps)
    marks = [started] + laps
    step_seconds = [b - a for a, b in zip(marks, marks[1:])]
    print(json.dumps({"step_seconds": step_seconds, "losses": losses,
                      "torch": torch.__version__}))


def run_torch(model: str, device: str, threads: int, steps: int) -> dict:
    command = [sys.executable, __file__, "--worker", model, "--torch-device", device,
               "--threads", str(threads), "--steps", str(steps)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"PyTorch {model} failed:\n{done.stderr}")
    report = json.loads(done.stdout)
    return {"step": steady_step_seconds(report["step_seconds"]),
            "losses": report["losses"], "torch": report["torch"]}


# ------------------------------------------------------------------ table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("cpu", "wgpu"), default="cpu",
                        help="dtr's backend (default: cpu)")
    parser.add_argument("--torch-device", choices=("cpu", "cuda"),
                        help="PyTorch's device (default: cuda with --backend wgpu, else cpu)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads for both frameworks (default: all cores)")
    parser.add_argument("--steps", type=int, default=10, help="training steps per run")
    parser.add_argument("--repeat", type=int, default=5,
                        help="runs per configuration; the fastest counts")
    parser.add_argument("--budget-ratio", type=float, default=0.5,
                        help="dtr's budget as a fraction of its unbounded peak")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated subset of " + ", ".join(MODELS))
    parser.add_argument("--quick", action="store_true",
                        help="3 steps and one run per configuration (a smoke test)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_device is None:
        args.torch_device = "cuda" if args.backend == "wgpu" else "cpu"
    if args.worker:
        torch_worker(args.worker, args.torch_device, args.threads, args.steps)
        return
    if args.quick:
        args.steps, args.repeat = 3, 1
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or args.steps < 2 or args.repeat < 1 or args.threads < 1:
        sys.exit(f"need --models from {MODELS}, --steps >= 2, --repeat >= 1, --threads >= 1")

    load_before = os.getloadavg()[0]
    rows = []
    for model in models:
        # Alternating, so that both frameworks meet the host's load alike.
        dtr_runs, torch_runs = [], []
        for _ in range(args.repeat):
            dtr_runs.append(run_dtr(model, args.backend, args.threads, args.steps,
                                    args.budget_ratio))
            torch_runs.append(run_torch(model, args.torch_device, args.threads, args.steps))
        dtr_step = min(r["unbounded"] for r in dtr_runs)
        budgeted_step = min(r["budgeted"] for r in dtr_runs)
        torch_step = min(r["step"] for r in torch_runs)
        rows.append({
            "model": model,
            "backend": args.backend,
            "torch_device": args.torch_device,
            "threads": args.threads,
            "steps": args.steps,
            "dtr_steps_per_s": 1 / dtr_step,
            "torch_steps_per_s": 1 / torch_step,
            "dtr_over_torch_step_time": dtr_step / torch_step,
            "dtr_budgeted_steps_per_s": 1 / budgeted_step,
            "budgeted_over_unbounded_step_time": budgeted_step / dtr_step,
            "losses_match": all(r["losses_match"] for r in dtr_runs),
            "dtr_peak_mib": dtr_runs[0]["peak_mib"],
            "rematerializations": dtr_runs[0]["rematerializations"],
            "dtr_first_loss": dtr_runs[0]["losses"][0],
            "torch_first_loss": torch_runs[0]["losses"][0],
            "torch": torch_runs[0]["torch"],
        })

    print(f"dtr on {args.backend}, PyTorch on {args.torch_device}; "
          f"{args.threads} thread(s), {args.steps} steps per run, median step after the first, "
          f"best of {args.repeat} runs; dtr budget {args.budget_ratio} x its unbounded peak; "
          f"{os.cpu_count()} cores, load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")
    # The examples compare losses bitwise on the CPU, within 1e-4 on a GPU.
    losses = "losses bitwise" if args.backend == "cpu" else "losses within 1e-4"
    header = ("model", "dtr steps/s", "PyTorch steps/s", "dtr/PyTorch time",
              f"dtr@{args.budget_ratio} steps/s", "budget/unbounded time", losses)
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        print(f"| {r['model']} | {r['dtr_steps_per_s']:.1f} | {r['torch_steps_per_s']:.1f} "
              f"| {r['dtr_over_torch_step_time']:.2f}x | {r['dtr_budgeted_steps_per_s']:.1f} "
              f"| {r['budgeted_over_unbounded_step_time']:.2f}x "
              f"| {'yes' if r['losses_match'] else 'NO'} |")
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
