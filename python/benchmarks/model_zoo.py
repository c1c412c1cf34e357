"""A correctness sweep of ``dtr.torch.budget`` over models it was not written for.

For each model (torchvision classifiers, ``transformers`` models built
locally from small configs: no download), at small sizes on the CPU, in this
process:

  stock              2 training steps of stock PyTorch: the reference
  None               the same under ``budget(None)``: its peak is "the tracked peak"
  R × peak           the same under a budget of R × the tracked peak (R in ``--ratios``)
  const + R × act    where R × peak is less than the constants alone (parameters,
                     gradients, optimizer state: never evicted, and at these small
                     sizes often most of the peak), a budget of the constants'
                     peak plus R × the rest, the activations

Every step is ``loss.backward()``, ``clip_grad_norm_``, ``optimizer.step()``
(SGD with momentum or AdamW, their default foreach implementations),
``zero_grad()``, with dropout on and the same seeds. A row checks, bitwise
against stock: every loss, every gradient (after clipping) and every
parameter after each step, and the global generator's next numbers after the
steps; and that the session's peak is within its budget and the engine's
invariants hold. A budget dtr cannot meet is an ``OOM`` row, any other
failure an ``error`` row; neither stops the sweep.

    python python/benchmarks/model_zoo.py                  # every model
    python python/benchmarks/model_zoo.py --models resnet18,gpt2 --ratios 0.5
    python python/benchmarks/model_zoo.py --list

Exits non-zero when any row under dtr is not bitwise equal to stock, passes
its budget, breaks an invariant or fails with anything but ``OOM``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import numpy
import torch

import dtr
import dtr.torch

MiB = 2**20


@dataclasses.dataclass
class Workload:
    model: torch.nn.Module
    optimizer: str  # "sgd" or "adamw"
    batches: List[Any]
    loss: Callable[[torch.nn.Module, Any], torch.Tensor]


def _optimizer(kind: str, params) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3)


# ----- torchvision ------------------------------------------------------------

def _images(batch: int, side: int, classes: int, steps: int = 2) -> list:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 3, side, side, generator=generator),
             torch.randint(0, classes, (batch,), generator=generator)) for _ in range(steps)]


def _classify(model: torch.nn.Module, batch) -> torch.Tensor:
    output = model(batch[0])
    # GoogLeNet and Inception return their auxiliary classifiers' logits too.
    if isinstance(output, tuple):
        logits = output[0]
        aux = [o for o in output[1:] if o is not None]
        loss = torch.nn.functional.cross_entropy(logits, batch[1])
        for extra in aux:
            loss = loss + 0.3 * torch.nn.functional.cross_entropy(extra, batch[1])
        return loss
    return torch.nn.functional.cross_entropy(output, batch[1])


def _vision(build: Callable[[], torch.nn.Module], optimizer: str, batch: int = 4,
            side: int = 32, classes: int = 10) -> Callable[[], Workload]:
    def make() -> Workload:
        model = build()
        return Workload(model, optimizer, _images(batch, side, classes), _classify)
    return make


def _tv(name: str, **kwargs) -> Callable[[], torch.nn.Module]:
    def build() -> torch.nn.Module:
        import torchvision
        return torchvision.models.get_model(name, weights=None, num_classes=10, **kwargs)
    return build


def _convnext() -> torch.nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 2)],
                    stochastic_depth_prob=0.1, num_classes=10)


def _swin() -> torch.nn.Module:
    from torchvision.models.swin_transformer import SwinTransformer
    return SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                           window_size=[4, 4], stochastic_depth_prob=0.1, num_classes=10,
                           dropout=0.1, attention_dropout=0.1)


def _tv_vit() -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4,
                             hidden_dim=64, mlp_dim=128, dropout=0.1, attention_dropout=0.1,
                             num_classes=10)


# ----- transformers -----------------------------------------------------------

def _tokens(batch: int, length: int, vocab: int, steps: int = 2) -> list:
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(0, vocab, (batch, length), generator=generator) for _ in range(steps)]


def _hf(config_name: str, model_name: str, sizes: Dict[str, Any], optimizer: str,
        loss: str = "causal", batch: int = 8, length: int = 64) -> Callable[[], Workload]:
    def make() -> Workload:
        import transformers
        transformers.logging.set_verbosity_error()
        config = getattr(transformers, config_name)(**sizes)
        model = getattr(transformers, model_name)(config)
        model.train()  # dropout on
        vocab = sizes.get("vocab_size", 256)
        batches = _tokens(batch, length, vocab)
        if loss == "causal":
            return Workload(model, optimizer, batches,
                            lambda m, ids: m(input_ids=ids, labels=ids).loss)
        if loss == "masked":
            def masked(m, ids):
                labels = ids.clone()
                labels[:, ::3] = -100  # ignored positions, as a masked LM has
                return m(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
            return Workload(model, optimizer, batches, masked)
        if loss == "seq2seq":
            def seq2seq(m, ids):
                half = ids.shape[1] // 2
                return m(input_ids=ids[:, :half].contiguous(), labels=ids[:, half:].contiguous()).loss
            return Workload(model, optimizer, batches, seq2seq)
        raise ValueError(loss)
    return make


def _hf_vit() -> Workload:
    import transformers
    transformers.logging.set_verbosity_error()
    config = transformers.ViTConfig(image_size=32, patch_size=8, num_hidden_layers=2,
                                    hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                    hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                                    num_labels=10)
    model = transformers.ViTForImageClassification(config)
    model.train()
    return Workload(model, "adamw", _images(8, 32, 10),
                    lambda m, b: m(pixel_values=b[0], labels=b[1]).loss)


_SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=128)
_DECODER = dict(_SMALL, num_key_value_heads=2, max_position_embeddings=128, attention_dropout=0.1)

MODELS: Dict[str, Callable[[], Workload]] = {
    "resnet18": _vision(_tv("resnet18"), "sgd", batch=8, side=64),
    "densenet121": _vision(_tv("densenet121"), "sgd"),
    "mobilenet_v3_small": _vision(_tv("mobilenet_v3_small"), "adamw", batch=8, side=64),
    "efficientnet_b0": _vision(_tv("efficientnet_b0"), "adamw"),
    "squeezenet1_1": _vision(_tv("squeezenet1_1"), "sgd", batch=8, side=64),
    "convnext": _vision(_convnext, "adamw", batch=8),
    "swin": _vision(_swin, "adamw", batch=8),
    "vit (torchvision)": _vision(_tv_vit, "adamw", batch=8),
    "googlenet": _vision(_tv("googlenet", aux_logits=True, init_weights=True), "sgd", side=64),
    "regnet_y_400mf": _vision(_tv("regnet_y_400mf"), "sgd"),
    "bert (masked LM)": _hf("BertConfig", "BertForMaskedLM", dict(_SMALL), "adamw", "masked"),
    "distilbert": _hf("DistilBertConfig", "DistilBertForMaskedLM",
                      dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, hidden_dim=128),
                      "adamw", "masked"),
    "gpt2": _hf("GPT2Config", "GPT2LMHeadModel",
                dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128), "adamw"),
    "llama": _hf("LlamaConfig", "LlamaForCausalLM", dict(_DECODER), "adamw"),
    "mistral": _hf("MistralConfig", "MistralForCausalLM", dict(_DECODER, sliding_window=16),
                   "sgd"),
    "qwen2": _hf("Qwen2Config", "Qwen2ForCausalLM", dict(_DECODER), "adamw"),
    "t5": _hf("T5Config", "T5ForConditionalGeneration",
              dict(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                   num_decoder_layers=2, num_heads=4, dropout_rate=0.1,
                   decoder_start_token_id=0, pad_token_id=0), "adamw", "seq2seq"),
    "gpt_neox": _hf("GPTNeoXConfig", "GPTNeoXForCausalLM",
                    dict(_SMALL, max_position_embeddings=128, hidden_dropout=0.1,
                         attention_dropout=0.1), "sgd"),
    "vit (transformers)": _hf_vit,
}


# ----- one run ------------------------------------------------------------------

def _digest(tensor: Optional[torch.Tensor]) -> str:
    """A hash of a CPU tensor's bytes (read on the host: under a budget, the
    host-read guard makes an evicted storage resident first)."""
    if tensor is None:
        return "none"
    array = numpy.ascontiguousarray(tensor.detach().numpy())
    return hashlib.blake2b(array.view(numpy.uint8), digest_size=16).hexdigest()


@dataclasses.dataclass
class Run:
    record: Dict[str, list]
    seconds: float
    stats: Optional[dict] = None


def train(work: Workload, limit, steps: int = 2) -> Run:
    """Trains a copy of the workload's model; "stock" runs without a session."""
    model = copy.deepcopy(work.model)
    params = list(model.parameters())
    optimizer = _optimizer(work.optimizer, params)
    record: Dict[str, list] = {"losses": [], "grads": [], "params": [], "after": []}

    seconds = 0.0

    def step(batch) -> None:
        nonlocal seconds
        start = time.perf_counter()
        loss = work.loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        seconds += time.perf_counter() - start
        record["losses"].append(_digest(loss))
        record["grads"].append([_digest(p.grad) for p in params])
        start = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad()
        seconds += time.perf_counter() - start
        record["params"].append([_digest(p) for p in params])

    torch.manual_seed(0)  # the same dropout masks in every row
    stats = None
    if limit == "stock":
        for batch in work.batches[:steps]:
            step(batch)
    else:
        with dtr.torch.budget(limit) as session:
            for batch in work.batches[:steps]:
                step(batch)
            session.check()
        stats = session.stats()
    record["after"].append(_digest(torch.rand(4)))  # where the global generator was left
    return Run(record, seconds, stats)


def first_difference(mine: Dict[str, list], stock: Dict[str, list]) -> Optional[str]:
    for step, (a, b) in enumerate(zip(mine["losses"], stock["losses"])):
        if a != b:
            return f"step {step}: loss differs"
    for what in ("grads", "params"):
        for step, (ours, theirs) in enumerate(zip(mine[what], stock[what])):
            for index, (a, b) in enumerate(zip(ours, theirs)):
                if a != b:
                    return f"step {step}: {what[:-1]} {index} differs"
    if mine["after"] != stock["after"]:
        return "the global generator was left elsewhere"
    if len(mine["losses"]) != len(stock["losses"]):
        return "a different number of steps"
    return None


def run_row(work: Workload, stock: Run, row: Dict[str, Any], limit: Optional[int]) -> dict:
    """Trains under ``budget(limit)`` and fills in ``row``."""
    try:
        run = train(work, limit)
    except dtr.OutOfMemory as error:
        row["oom"] = str(error)
        return row
    except Exception as error:  # noqa: BLE001 - a row, not a crash
        row["error"] = f"{type(error).__name__}: {error}"
        row["traceback"] = traceback.format_exc()
        return row
    stats = run.stats
    row.update(ops=stats["ops"] // 2, peak=stats["peak_bytes"],
               constant=stats["constant_peak_bytes"], evictions=stats["evictions"],
               remats=stats["rematerializations"], slowdown=run.seconds / stock.seconds,
               difference=first_difference(run.record, stock.record))
    if limit is not None and stats["peak_bytes"] > limit:
        row["error"] = f"peak {stats['peak_bytes']} B over the budget {limit} B"
    return row


def sweep(name: str, ratios: List[float]) -> List[dict]:
    rows: List[dict] = []
    try:
        torch.manual_seed(0)
        work = MODELS[name]()
        stock = train(work, "stock")
        # Twice, the first a warm-up: lazy imports and first-call costs fall on it.
        stock = train(work, "stock")
    except Exception as error:  # noqa: BLE001 - a row, not a crash
        return [dict(model=name, row="stock", error=f"{type(error).__name__}: {error}")]
    rows.append(dict(model=name, row="stock", seconds=stock.seconds))
    baseline = run_row(work, stock, dict(model=name, row="None"), None)
    rows.append(baseline)
    if "peak" not in baseline:
        return rows
    peak, constant = baseline["peak"], baseline["constant"]
    for ratio in ratios:
        # A budget of the ratio × the tracked peak; at these sizes parameters
        # and optimizer state (constants, never evicted) often hold more than
        # that alone: then the row is OOM without running, and another row
        # gives the activations, the evictable part, that ratio beside them.
        limit = int(peak * ratio)
        row = dict(model=name, row=f"{ratio:g} × peak", budget=limit)
        rows.append(row)
        if limit < constant:
            row["oom"] = f"constants alone hold {constant} B"
            limit = constant + int((peak - constant) * ratio)
            rows.append(run_row(work, stock, dict(model=name, row=f"const + {ratio:g} × act",
                                                  budget=limit), limit))
        else:
            run_row(work, stock, row, limit)
    return rows


def _mib(value: Optional[int]) -> str:
    return "—" if value is None else f"{value / MiB:.2f}"


def table(rows: List[dict]) -> str:
    lines = ["| model | row | ops/step | budget MiB | peak MiB | constants MiB | evictions "
             "| remats | slowdown | bitwise | error |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in rows:
        if row["row"] == "stock":
            if "error" in row:
                lines.append(f"| {row['model']} | stock | | | | | | | | | {row['error']} |")
            continue
        if "oom" in row:
            why = ("OOM: parameters and optimizer state alone need more"
                   if row["oom"].startswith("constants alone") else "OOM")
            lines.append(f"| {row['model']} | {row['row']} | | {_mib(row.get('budget'))} "
                         f"| | | | | | | {why} |")
            continue
        if "ops" not in row:
            lines.append(f"| {row['model']} | {row['row']} | | {_mib(row.get('budget'))} "
                         f"| | | | | | | {row.get('error', '')} |")
            continue
        bitwise = "yes" if row["difference"] is None else f"**no** ({row['difference']})"
        lines.append(
            f"| {row['model']} | {row['row']} | {row['ops']} | {_mib(row.get('budget'))} "
            f"| {_mib(row['peak'])} | {_mib(row['constant'])} | {row['evictions']} "
            f"| {row['remats']} "
            f"| {row['slowdown']:.2f}× | {bitwise} | {row.get('error', '')} |")
    return "\n".join(lines)


def failed(row: dict) -> bool:
    return "error" in row or (row["row"] != "stock" and "oom" not in row
                              and row.get("difference") is not None)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated names (default: all; see --list)")
    parser.add_argument("--ratios", default="0.5,0.3", help="budgets, × the tracked peak")
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(MODELS))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    names = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    ratios = [float(r) for r in args.ratios.split(",") if r.strip()]
    rows: List[dict] = []
    start = time.perf_counter()
    for name in names:
        began = time.perf_counter()
        model_rows = sweep(name, ratios)
        rows.extend(model_rows)
        print(table(model_rows).split("\n", 2)[-1], f"  ({time.perf_counter() - began:.1f} s)",
              file=sys.stderr, flush=True)
        for row in model_rows:
            if "traceback" in row:
                print(row["traceback"], file=sys.stderr)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{time.perf_counter() - start:.0f} s")
    print(table(rows))
    return 1 if any(failed(row) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
