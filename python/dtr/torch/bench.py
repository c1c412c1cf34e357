"""``python -m dtr.torch.bench``: what ``dtr.torch.budget`` saves and costs on real models.

Trains ResNet-50 (torchvision, batch 32 of 224×224 images, SGD with
momentum), a 6-layer GPT-2 (transformers, batch 8 × 512 tokens, AdamW) and an
LSTM language model (SGD) on random, seeded data, one warm-up step then
``--steps`` measured steps, as these rows:

  stock PyTorch            the reference
  budget(None)             dtr tracking only; its ``peak_bytes`` is "the tracked peak"
  dtr R× peak              a budget of R × the tracked peak, for each of ``--ratios``
  checkpoint               ``torch.utils.checkpoint`` (non-reentrant) around every
                           block: ResNet's Bottlenecks, GPT-2's layers, each LSTM layer
  checkpoint, budget(None) the same, tracked, for its peak
  dtr at checkpoint's peak the unmodified model under that peak as its budget

Each row runs in its own process started with ``MALLOC_MMAP_THRESHOLD_=65536``
(so that freed tensors leave the resident set) and reports: the growth of
the resident set's high-water mark over the measured steps (VmHWM after the
warm-up cleared it, minus VmRSS then; on CUDA also the growth of
``torch.cuda.max_memory_allocated``), the session's tracked peak, the median
step time and its ratio to stock's, the median CPU time of a step (all the
process's threads: steadier than the wall clock on a shared machine), the evictions, rematerializations and
recomputation time of the measured steps, and whether every loss and
gradient is bitwise equal to stock's. Gradients are compared by a hash of
their bytes, so that no copy of them shows in the memory measured.
Last, on a small MLP in the parent process, the time budget(None) adds per ATen op,
beside the time a dispatch mode that only runs each op adds: the part of it
that any mode written in Python pays.
On CUDA every row, stock included, runs with deterministic algorithms
(``torch.use_deterministic_algorithms(True)``, ``CUBLAS_WORKSPACE_CONFIG``,
cuDNN's deterministic kernels): else stock PyTorch does not reproduce itself.

    python -m dtr.torch.bench                          # all three models, CPU
    python -m dtr.torch.bench --models lstm --steps 5 --json lstm.json
    python -m dtr.torch.bench --quick                  # tiny sizes: a smoke test
    python -m dtr.torch.bench --models lstm --mark-steps --heuristic dtr-next

Exits non-zero when a row under dtr (the unmodified model) is not bitwise
equal to stock or exceeds its budget, or when a case fails; a budget dtr
cannot meet is reported as OOM in its row.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

import numpy
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import dtr
import dtr.torch

MiB = 2**20
Limit = Union[int, str, None]  # bytes, "stock" (no session), or None (tracking only)


# ----- the workloads ---------------------------------------------------------

@dataclasses.dataclass
class Workload:
    description: str
    model: torch.nn.Module
    make_optimizer: Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
    make_batch: Callable[[torch.Generator], Any]  # a batch on the CPU
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]


class Checkpointed(torch.nn.Module):
    """Runs ``inner`` under non-reentrant checkpointing: backward recomputes its activations."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, *args, use_reentrant=False)


def resnet50(quick: bool, checkpointed: bool) -> Workload:
    from torchvision.models import resnet50 as build

    batch, side, classes, width = (16, 64, 10, 8) if quick else (32, 224, 1000, 64)
    model = build(weights=None, num_classes=classes, width_per_group=width)
    if checkpointed:
        for stage in (model.layer1, model.layer2, model.layer3, model.layer4):
            for index, block in enumerate(stage):
                stage[index] = Checkpointed(block)  # parameter order unchanged

    def make_batch(generator: torch.Generator):
        return (torch.randn(batch, 3, side, side, generator=generator),
                torch.randint(0, classes, (batch,), generator=generator))

    return Workload(
        f"torchvision ResNet-50 ({classes} classes, bottleneck width {width} per group), "
        f"batch {batch} × 3×{side}×{side}, SGD with momentum 0.9",
        model, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), make_batch,
        lambda model, batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1]))


def gpt2(quick: bool, checkpointed: bool) -> Workload:
    import transformers

    transformers.logging.set_verbosity_error()
    if quick:
        sizes = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
        batch, length = 4, 128
    else:
        sizes = dict(n_layer=6, n_embd=768, n_head=12)
        batch, length = 8, 512
    # No KV cache: it is inference's, and checkpointing turns it off anyway.
    config = transformers.GPT2Config(**sizes, use_cache=False)
    model = transformers.GPT2LMHeadModel(config)
    model.train()  # dropout on
    if checkpointed:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # the new name, transformers 5
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    def make_batch(generator: torch.Generator):
        return torch.randint(0, config.vocab_size, (batch, length), generator=generator)

    return Workload(
        f"GPT-2 ({sizes['n_layer']} layers, n_embd {sizes['n_embd']}), "
        f"batch {batch} × {length} tokens, AdamW",
        model, lambda params: torch.optim.AdamW(params, lr=1e-4), make_batch,
        lambda model, ids: model(input_ids=ids, labels=ids).loss)


class LanguageModel(torch.nn.Module):
    """Embedding → a stack of single-layer LSTMs (each one checkpointable) → logits."""

    def __init__(self, vocab: int, embedding: int, hidden: int, layers: int,
                 checkpointed: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, embedding)
        self.layers = torch.nn.ModuleList(
            torch.nn.LSTM(embedding if i == 0 else hidden, hidden, batch_first=True)
            for i in range(layers))
        self.dropout = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(hidden, vocab)
        self.checkpointed = checkpointed

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens)
        for lstm in self.layers:
            if self.checkpointed:
                hidden = checkpoint(_outputs, lstm, hidden, use_reentrant=False)
            else:
                hidden = _outputs(lstm, hidden)
            hidden = self.dropout(hidden)
        return self.head(hidden)


def _outputs(lstm: torch.nn.LSTM, x: torch.Tensor) -> torch.Tensor:
    return lstm(x)[0]  # not the final state


def lstm(quick: bool, checkpointed: bool) -> Workload:
    vocab, embedding, hidden, layers, batch, length = (
        (256, 64, 64, 4, 16, 64) if quick else (10000, 512, 1024, 3, 32, 128))
    model = LanguageModel(vocab, embedding, hidden, layers, checkpointed)

    def make_batch(generator: torch.Generator):
        return torch.randint(0, vocab, (batch, length + 1), generator=generator)

    def loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        logits = model(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                 tokens[:, 1:].reshape(-1))

    return Workload(
        f"LSTM language model (vocab {vocab}, embedding {embedding}, {layers} × LSTM({hidden})), "
        f"batch {batch} × {length} tokens, SGD with momentum 0.9",
        # Not Adam: its second state buffer per weight pins one more copy of
        # the large embedding and output layers, leaving too little to evict at 0.5.
        model, lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), make_batch, loss)


WORKLOADS = {"resnet50": resnet50, "gpt2": gpt2, "lstm": lstm}


# ----- one case, in a child process --------------------------------------------

def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"/proc/self/status has no {field}")


class MemoryWatch:
    """Peak growth from now on: of the resident set, and on CUDA of allocated memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets VmHWM to the current VmRSS
        self.rss = _proc_status_bytes("VmRSS")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            self.allocated = torch.cuda.memory_allocated(device)

    def growth(self) -> Dict[str, Optional[int]]:
        cuda = None
        if self.device.type == "cuda":
            cuda = torch.cuda.max_memory_allocated(self.device) - self.allocated
        return {"rss_growth": _proc_status_bytes("VmHWM") - self.rss, "cuda_growth": cuda}


def _digest(tensor: Optional[torch.Tensor]) -> str:
    """A hash of the tensor's bytes, read in place on the CPU: a copy would show in the memory."""
    if tensor is None:
        return "none"
    array = numpy.ascontiguousarray(tensor.cpu().numpy())
    return hashlib.blake2b(array, digest_size=16).hexdigest()


def _first_difference(mine: dict, stock: dict) -> Optional[str]:
    """None when every loss and gradient matches stock's bit for bit, else the first difference."""
    for step, (ours, theirs) in enumerate(zip(mine["losses"], stock["losses"])):
        if ours != theirs:
            return f"step {step}: loss {float.fromhex(ours)!r} != {float.fromhex(theirs)!r}"
    for step, (ours, theirs) in enumerate(zip(mine["grads"], stock["grads"])):
        for index, (a, b) in enumerate(zip(ours, theirs)):
            if a != b:
                return f"step {step}: the gradient of parameter {index} differs"
    if len(mine["losses"]) != len(stock["losses"]):
        return "a different number of steps"
    return None


def _stats_delta(after: dict, before: dict) -> dict:
    """The session's figures for the measured steps alone."""
    fields = ("evictions", "rematerializations", "remat_seconds", "ops", "planned_steps")
    return {field: after[field] - before[field] for field in fields}


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, tuple):
        return tuple(item.to(device) for item in batch)
    return batch.to(device)


def run_case(case: dict) -> dict:
    """Trains one row's model for a warm-up and the measured steps; returns its figures."""
    device = torch.device(case["device"])
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        # Else stock does not even match itself: cuDNN's autotuned kernels,
        # cuBLAS's split reductions and attention's atomic backward (GPT-2's
        # loss differed from the second step). Strict mode, since with
        # `warn_only` the fused attention kernels only warn and stay
        # nondeterministic; cuBLAS reads its setting when it first starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # the same initial weights in every row
    work = WORKLOADS[case["model"]](case["quick"], case["checkpointed"])
    model = work.model.to(device)
    params = list(model.parameters())
    optimizer = work.make_optimizer(params)
    batches = [_to(work.make_batch(torch.Generator().manual_seed(step)), device)
               for step in range(1 + case["steps"])]
    record: Dict[str, list] = {"losses": [], "grads": []}

    cpu_times: List[float] = []
    limit = case["limit"]
    session = None if limit == "stock" else dtr.torch.budget(
        limit, heuristic=case["heuristic"], device=device)

    def step(batch) -> float:
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = work.loss(model, batch)
        loss.backward()
        optimizer.step()
        if session is not None and case["mark_steps"]:
            session.mark_step()
        sync()
        seconds = time.perf_counter() - start
        cpu_times.append(time.process_time() - cpu_start)
        # Checked outside the timing; zero_grad after, so the gradients are read.
        record["losses"].append(loss.item().hex())
        record["grads"].append([_digest(p.grad) for p in params])
        optimizer.zero_grad()
        return seconds

    result: Dict[str, Any] = {"description": work.description}
    torch.manual_seed(1)  # the same dropout masks in every row
    try:
        with session if session is not None else contextlib.nullcontext():
            step(batches[0])  # warm-up, in the same regime: optimizer state exists after it
            before = session.stats() if session is not None else None
            watch = MemoryWatch(device)
            times = [step(batch) for batch in batches[1:]]
            result.update(watch.growth())
    except dtr.OutOfMemory as error:
        return {**result, "oom": str(error)}
    result["step_seconds"] = statistics.median(times)
    # The process's CPU time (all its threads): steadier than the wall clock
    # when other work shares the machine.
    result["step_cpu_seconds"] = statistics.median(cpu_times[1:])
    if session is not None:
        stats = session.stats()
        result.update(_stats_delta(stats, before), peak_bytes=stats["peak_bytes"],
                      budget_bytes=stats["budget_bytes"])
    if case["save_reference"]:
        torch.save(record, case["reference"])
    else:
        stock = torch.load(case["reference"])
        result["difference"] = _first_difference(record, stock)
        result["bitwise"] = result["difference"] is None
    return result


def measure_overhead(device: torch.device, heuristic: str, quick: bool) -> dict:
    """The time budget(None) adds per ATen op, on a small MLP trained stock
    and tracked in turn, in this process: (tracked − stock) / ops. Measured in
    the parent: the children's malloc, which maps and unmaps every tensor of
    64 KiB or more, would add its system calls to both and to the difference."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[layer for _ in range(16) for layer in
                                  (torch.nn.Linear(256, 256), torch.nn.ReLU())]).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    steps, repetitions = (3, 3) if quick else (20, 7)

    def timed(session: Optional[dtr.torch.Session]) -> float:
        start = time.perf_counter()
        with session if session is not None else contextlib.nullcontext():
            for _ in range(steps):
                model(x).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            sync()
        return time.perf_counter() - start

    def tracked() -> dtr.torch.Session:
        return dtr.torch.budget(None, heuristic=heuristic, device=device)

    timed(None), timed(tracked()), timed(_PassThrough())  # warm-up: kernels, caches, optimizer
    stock_times, tracked_times, mode_times = [], [], []
    for _ in range(repetitions):
        stock_times.append(timed(None))
        session = tracked()
        tracked_times.append(timed(session))
        mode_times.append(timed(_PassThrough()))
        ops = session.stats()["ops"]
    stock, tracked_seconds, mode_seconds = (
        statistics.median(times) for times in (stock_times, tracked_times, mode_times))
    return {"us_per_op": (tracked_seconds - stock) / ops * 1e6,
            "mode_us_per_op": (mode_seconds - stock) / ops * 1e6, "ops_per_step": ops / steps,
            "stock_step_seconds": stock / steps, "tracked_step_seconds": tracked_seconds / steps}


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that only runs each op: what any mode written in
    Python costs per op, the floor of ``budget(None)``'s added cost."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def serve() -> None:
    """The child's side: one JSON case per line of stdin, one JSON result per line of stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever else is printed must not garble the replies
    for line in sys.stdin:
        case = json.loads(line)
        try:
            result = run_case(case)
        except Exception as error:  # reported in the row; the parent decides the exit code
            traceback.print_exc()
            result = {"error": f"{type(error).__name__}: {error}"}
        print(json.dumps({**case, **result}), file=out, flush=True)


# ----- the parent ----------------------------------------------------------------

class Children:
    """Runs cases in child processes: a fresh one per case, so each starts with an
    empty heap, or (``reuse``, for --quick) one for a whole model, to save start-ups."""

    def __init__(self, reuse: bool) -> None:
        self.reuse = reuse
        self.process: Optional[subprocess.Popen] = None

    def run(self, case: dict) -> dict:
        if self.process is None:
            package_root = str(Path(__file__).resolve().parents[2])  # the same dtr in the child
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536",
                       PYTHONPATH=os.pathsep.join(filter(None, [package_root,
                                                                os.environ.get("PYTHONPATH")])))
            self.process = subprocess.Popen([sys.executable, "-m", "dtr.torch.bench", "--child"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            text=True, env=env)
        self.process.stdin.write(json.dumps(case) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply or not self.reuse:
            code = self.close()
            if not reply:
                return {**case, "error": f"the child process died (exit status {code})"}
        return json.loads(reply)

    def close(self) -> Optional[int]:
        if self.process is None:
            return None
        self.process.stdin.close()
        code = self.process.wait()
        self.process = None
        return code


def bench_model(name: str, args: argparse.Namespace, reference: Path) -> List[dict]:
    """Every row of one model, in order; later budgets come from earlier rows' peaks."""
    base = dict(model=name, device=args.device, heuristic=args.heuristic, steps=args.steps,
                mark_steps=args.mark_steps, quick=args.quick, reference=str(reference), save_reference=False)
    children = Children(reuse=args.quick)
    rows: List[dict] = []

    def run(row: str, limit: Limit, checkpointed: bool = False, **extra: Any) -> dict:
        # The unmodified model under dtr must match stock; checkpointing may not.
        strict = limit != "stock" and not checkpointed
        case = dict(base, row=row, limit=limit, checkpointed=checkpointed, strict=strict, **extra)
        start = time.perf_counter()
        result = children.run(case)
        print(f"{name}: {row}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        rows.append(result)
        return result

    def budget_row(row: str, peak: Optional[int], ratio: float) -> None:
        if peak is None:
            rows.append(dict(base, row=row, strict=True, error="no tracked peak to budget from"))
        else:
            run(row, int(peak * ratio), ratio=ratio)

    try:
        run("stock PyTorch", "stock", save_reference=True)
        peak = run("budget(None)", None).get("peak_bytes")
        for ratio in args.ratios:
            budget_row(f"dtr {ratio:g}× peak", peak, ratio)
        run("checkpoint", "stock", checkpointed=True)
        checkpoint_peak = run("checkpoint, budget(None)", None, checkpointed=True).get("peak_bytes")
        budget_row("dtr at checkpoint's peak", checkpoint_peak, 1.0)
    finally:
        children.close()
    return rows


def _mib(value: Optional[int]) -> str:
    return "—" if value is None else f"{value / MiB:.1f}"


def _ratio(value: Optional[float], reference: Optional[float]) -> str:
    return "—" if value is None or not reference else f"{value / reference:.2f}×"


def _bitwise(row: dict) -> str:
    if row.get("save_reference"):
        return "(reference)"
    if "bitwise" not in row:
        return "—"
    verdict = "yes" if row["bitwise"] else f"NO ({row['difference']})"
    return verdict if row["strict"] else verdict + " (informational)"


def table(rows: List[dict], cuda: bool) -> str:
    """One model's rows as Markdown, with ratios to stock's memory and time."""
    stock = rows[0]
    header = ["row", "budget MiB", "tracked peak MiB", "RSS growth MiB", "RSS ×stock"]
    if cuda:
        header += ["CUDA growth MiB", "CUDA ×stock"]
    header += ["step s", "time ×stock", "CPU s", "CPU ×stock", "evictions", "remats", "remat s", "bitwise equal to stock"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        failure = row.get("error") or ("OOM: " + row["oom"] if "oom" in row else None)
        if failure is not None:
            cells = [row["row"], _mib(row.get("limit") if row.get("strict") else None)]
            cells += [""] * (len(header) - 3) + [failure.splitlines()[0]]
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells = [row["row"], _mib(row.get("budget_bytes")), _mib(row.get("peak_bytes")),
                 _mib(row["rss_growth"]), _ratio(row["rss_growth"], stock.get("rss_growth"))]
        if cuda:
            cells += [_mib(row["cuda_growth"]),
                      _ratio(row["cuda_growth"], stock.get("cuda_growth"))]
        cells += [f"{row['step_seconds']:.3f}",
                  _ratio(row["step_seconds"], stock.get("step_seconds")),
                  f"{row['step_cpu_seconds']:.2f}",
                  _ratio(row["step_cpu_seconds"], stock.get("step_cpu_seconds")),
                  str(row.get("evictions", "—")), str(row.get("rematerializations", "—")),
                  f"{row['remat_seconds']:.3f}" if "remat_seconds" in row else "—", _bitwise(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def failures(rows: List[dict]) -> List[str]:
    """What makes the run fail: crashed cases, and dtr rows that differ or overrun."""
    found = []
    for row in rows:
        where = f"{row['model']}: {row['row']}"
        if "error" in row:
            found.append(f"{where}: {row['error'].splitlines()[0]}")
        elif row["strict"] and "oom" not in row:
            if not row["bitwise"]:
                found.append(f"{where}: not bitwise equal to stock ({row['difference']})")
            budget = row["budget_bytes"]
            if budget is not None and row["peak_bytes"] > budget:
                found.append(f"{where}: tracked peak {row['peak_bytes']} B "
                             f"over the budget {budget} B")
    return found


def _comma_list(text: str) -> List[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtr.torch.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=_comma_list, default=list(WORKLOADS),
                        help="comma-separated, of: " + ", ".join(WORKLOADS))
    parser.add_argument("--steps", type=int,
                        help="measured steps, after 1 warm-up step (default 3, with --quick 2)")
    parser.add_argument("--ratios", type=lambda text: [float(r) for r in _comma_list(text)],
                        default=[0.7, 0.5, 0.4], help="budgets, as fractions of the tracked peak")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--heuristic", default="dtr")
    parser.add_argument("--mark-steps", action="store_true",
                        help="end every step with session.mark_step(): later steps follow plans")
    parser.add_argument("--quick", action="store_true", help="tiny models: a smoke test")
    parser.add_argument("--json", metavar="PATH", help="also save every row here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        serve()
        return 0
    if args.steps is None:
        args.steps = 2 if args.quick else 3
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    bad = [ratio for ratio in args.ratios if not 0 < ratio <= 1]
    if bad or not args.ratios:
        parser.error(f"--ratios must be fractions of the peak in (0, 1], got {args.ratios}")
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        parser.error(f"--device {args.device!r}: {error}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this PyTorch sees no CUDA device")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        parser.error(f"--json {args.json}: its directory does not exist")
    if args.heuristic not in dict(dtr.heuristics()):
        parser.error(f"unknown heuristic {args.heuristic!r}; known: "
                     f"{', '.join(name for name, _ in dtr.heuristics())}")
    unknown = [name for name in args.models if name not in WORKLOADS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")

    rows: List[dict] = []
    cuda = torch.device(args.device).type == "cuda"
    with tempfile.TemporaryDirectory(prefix="dtr-bench-") as scratch:
        for name in args.models:
            start = time.perf_counter()
            model_rows = bench_model(name, args, Path(scratch) / f"{name}-stock.pt")
            rows += model_rows
            print(f"\n### {name}: {model_rows[0].get('description', '')}\n")
            print(f"{args.steps} measured steps after 1 warm-up step, on {args.device}; "
                  f"step s: the median; evictions, remats, remat s: totals over the measured "
                  f"steps; wall time {time.perf_counter() - start:.0f} s.\n")
            print(table(model_rows, cuda))
            by_row = {row["row"]: row for row in model_rows}
            ours, theirs = by_row["dtr at checkpoint's peak"], by_row["checkpoint"]
            if "step_seconds" in ours and "step_seconds" in theirs:
                print(f"\ndtr at checkpointing's peak: "
                      f"{_ratio(ours['step_seconds'], theirs['step_seconds'])} "
                      f"checkpointing's step time "
                      f"({_ratio(ours['step_cpu_seconds'], theirs['step_cpu_seconds'])} "
                      f"its CPU time).", flush=True)
    overhead = measure_overhead(torch.device(args.device), args.heuristic, args.quick)
    print(f"\nadded cost per ATen op under budget(None): {overhead['us_per_op']:.1f} µs; "
          f"a dispatch mode that only runs each op adds {overhead['mode_us_per_op']:.1f} µs "
          f"(MLP 16 × Linear(256), batch 64: {overhead['ops_per_step']:.0f} ops a step, "
          f"stock {overhead['stock_step_seconds'] * 1e3:.2f} ms a step, "
          f"tracked {overhead['tracked_step_seconds'] * 1e3:.2f} ms)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "overhead": overhead}, indent=1))
    problems = failures(rows)
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
