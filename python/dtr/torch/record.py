"""``python -m dtr.torch.record --model torchvision:resnet50 --batch 32 --out resnet50.jsonl``

Builds a model locally (no download), runs ``--warmup`` unrecorded training
steps so optimizer state exists as in steady state, then records ``--steps``
steps into a dtr trace with :func:`dtr.torch.record`; replay it with
``dtr replay``. Models:

  torchvision:NAME      an image classifier (random weights), on random images;
                        auxiliary heads (GoogLeNet, Inception v3) count in the loss
  transformers:NAME     a model built from ``transformers.AutoConfig.for_model(NAME)``
                        with ``--config key=value,...`` overrides, on random tokens;
                        a causal, masked or else sequence-to-sequence language-model
                        head when NAME has one (labels = the tokens)
  bench:NAME            a workload of ``python -m dtr.torch.bench`` (resnet50, gpt2,
                        lstm) with its own sizes, batch and optimizer (``--quick``:
                        its tiny sizes); ``--batch``, ``--optimizer`` and ``--lr`` do
                        not apply
  MODULE:FACTORY        ``FACTORY()`` returns an nn.Module taking an image batch

for example ``--model transformers:gpt2 --config n_layer=4,n_embd=256,n_head=4``,
or ``--model bench:lstm`` for the LSTM language model.
(Import the function as ``from dtr.torch import record``.)
"""

from __future__ import annotations

import argparse
import ast
import importlib
import sys
from pathlib import Path
from typing import Callable, Dict, Tuple

import torch

import dtr.torch

Step = Callable[[int], torch.Tensor]  # runs forward for batch `i`, returns the loss


def parse_overrides(text: str) -> Dict[str, object]:
    """``n_layer=4,n_embd=256,activation_function=gelu`` → a dict of Python values."""
    overrides: Dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--config {text!r}: expected key=value pairs, got {item!r}")
        try:
            overrides[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            overrides[key.strip()] = value.strip()  # a bare string such as gelu
    return overrides


def classification_loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the logits; models with auxiliary heads in training
    (GoogLeNet, Inception v3 return named tuples) add each head's, weighted
    0.3 as in GoogLeNet's paper."""
    if isinstance(outputs, torch.Tensor):
        return torch.nn.functional.cross_entropy(outputs, labels)
    heads = [head for head in outputs if isinstance(head, torch.Tensor)]
    if not heads:
        raise SystemExit(f"the model returned a {type(outputs).__name__} with no tensor in it")
    loss = torch.nn.functional.cross_entropy(heads[0], labels)
    for head in heads[1:]:
        loss = loss + 0.3 * torch.nn.functional.cross_entropy(head, labels)
    return loss


def image_model(spec: str, args) -> Tuple[torch.nn.Module, Step]:
    source, _, name = spec.partition(":")
    if source == "torchvision":
        try:
            import torchvision
        except ImportError:
            raise SystemExit("--model torchvision:…: torchvision is not installed (pip install torchvision)")
        try:
            model = torchvision.models.get_model(name, weights=None, num_classes=args.classes)
        except ValueError as error:
            raise SystemExit(f"--model {spec!r}: {error}")
    else:
        try:
            model = getattr(importlib.import_module(source), name)()
        except (ImportError, AttributeError) as error:
            raise SystemExit(f"--model {spec!r}: {error}")
        if not isinstance(model, torch.nn.Module):
            raise SystemExit(f"--model {spec!r}: {name}() returned a {type(model).__name__}, "
                             f"not an nn.Module")
    model = model.to(args.device)

    def step(i: int) -> torch.Tensor:
        generator = torch.Generator(args.device).manual_seed(args.seed + i)
        images = torch.randn(args.batch, 3, args.image, args.image, device=args.device,
                             generator=generator)
        labels = torch.randint(0, args.classes, (args.batch,), device=args.device,
                               generator=generator)
        return classification_loss(model(images), labels)

    return model, step


def transformers_model(name: str, args) -> Tuple[torch.nn.Module, Step]:
    try:
        import transformers
    except ImportError:
        raise SystemExit("--model transformers:…: transformers is not installed (pip install transformers)")
    overrides = {"use_cache": False, **parse_overrides(args.config)}
    try:
        config = transformers.AutoConfig.for_model(name, **overrides)
    except ValueError as error:
        raise SystemExit(f"--model transformers:{name}: {error}")
    model = None
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForMaskedLM,
                 transformers.AutoModelForSeq2SeqLM):
        try:
            model = auto.from_config(config)
            break
        except ValueError:
            continue  # no such head for this architecture
    with_labels = model is not None
    if model is None:
        model = transformers.AutoModel.from_config(config)
    model = model.to(args.device)
    if (getattr(model.config, "is_encoder_decoder", False)
            and getattr(model.config, "decoder_start_token_id", None) is None):
        # A bare config leaves it unset (pretrained T5 checkpoints use the
        # padding token): the decoder's inputs are the labels shifted right.
        pad = getattr(model.config, "pad_token_id", None)
        model.config.decoder_start_token_id = pad if pad is not None else 0
    vocab = getattr(config, "vocab_size", None)
    if not vocab:
        raise SystemExit(f"--model transformers:{name}: the config has no vocab_size; "
                         f"only text models are supported")

    def step(i: int) -> torch.Tensor:
        generator = torch.Generator(args.device).manual_seed(args.seed + i)
        tokens = torch.randint(0, vocab, (args.batch, args.seq), device=args.device,
                               generator=generator)
        if with_labels:
            return model(input_ids=tokens, labels=tokens).loss
        return model(input_ids=tokens).last_hidden_state.float().pow(2).mean()

    return model, step


def bench_model(name: str, args) -> Tuple[torch.nn.Module, Step, torch.optim.Optimizer]:
    from dtr.torch import bench

    build = bench.WORKLOADS.get(name)
    if build is None:
        raise SystemExit(f"--model bench:{name}: no such workload; "
                         f"expected one of {', '.join(sorted(bench.WORKLOADS))}")
    try:
        workload = build(args.quick, False)
    except ImportError as error:
        raise SystemExit(f"--model bench:{name}: {error}")
    model = workload.model.to(args.device)
    optimizer = workload.make_optimizer(model.parameters())

    def step(i: int) -> torch.Tensor:
        batch = workload.make_batch(torch.Generator().manual_seed(args.seed + i))
        return workload.loss(model, bench._to(batch, torch.device(args.device)))

    return model, step, optimizer


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtr.torch.record", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="torchvision:NAME, transformers:NAME, bench:NAME or MODULE:FACTORY")
    parser.add_argument("--config", default="", help="transformers config overrides, key=value,...")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=224, help="image side in pixels")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--seq", type=int, default=512, help="tokens per sequence (transformers)")
    parser.add_argument("--optimizer", choices=["sgd", "adamw"],
                        help="default: sgd with momentum 0.9 for images, adamw for transformers")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=1, help="training steps recorded")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps first")
    parser.add_argument("--quick", action="store_true", help="bench:NAME at its tiny sizes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the trace file to write (.jsonl)")
    args = parser.parse_args(argv)
    for flag in ("batch", "image", "classes", "seq", "steps"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} must be at least 1")
    if args.warmup < 0:
        raise SystemExit("--warmup cannot be negative")
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        raise SystemExit(f"--device {args.device!r}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: this PyTorch sees no CUDA device")
    out = Path(args.out)
    if out.is_dir() or not out.resolve().parent.is_dir():
        raise SystemExit(f"--out {args.out}: not a file in an existing directory")
    source, sep, name = args.model.partition(":")
    if not sep or not source or not name:
        raise SystemExit(f"--model {args.model!r}: expected SOURCE:NAME, e.g. torchvision:resnet50")

    torch.manual_seed(args.seed)
    if source == "bench":
        model, step, optimizer = bench_model(name, args)
    else:
        if source == "transformers":
            model, step = transformers_model(name, args)
            optimizer_name = args.optimizer or "adamw"
        else:
            model, step = image_model(args.model, args)
            optimizer_name = args.optimizer or "sgd"
        if optimizer_name == "sgd":
            optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        else:
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()

    def train(i: int) -> None:
        loss = step(i)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    for i in range(args.warmup):
        train(i)
    with dtr.torch.record(args.out, model, optimizer) as session:
        for i in range(args.warmup, args.warmup + args.steps):
            train(i)
    stats = session.stats()
    print(f"{args.out}: {stats['engine_ops']} ops recorded, "
          f"peak {stats['peak_bytes'] / 2**20:.1f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
