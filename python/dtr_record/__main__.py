"""``python -m dtr_record --model torchvision:resnet50 --batch 32 --out resnet50.jsonl``

Builds the model without weights, runs ``--warmup`` unrecorded training steps
(so optimiser state exists, as in steady state), then records ``--steps``
steps of SGD on random images and labels into a dtr trace.
"""

import argparse
import importlib
import sys

import torch

from .recorder import record_training


def build_model(spec: str, classes: int) -> torch.nn.Module:
    """``torchvision:NAME`` (built without weights) or ``package.module:factory``."""
    module_name, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--model {spec!r}: expected MODULE:NAME, e.g. torchvision:resnet50")
    if module_name == "torchvision":
        try:
            import torchvision
        except ImportError:
            raise SystemExit("--model torchvision:…: torchvision is not installed (pip install torchvision)")
        try:
            return torchvision.models.get_model(name, weights=None, num_classes=classes)
        except ValueError as error:
            raise SystemExit(f"--model {spec!r}: {error}")
    try:
        factory = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as error:
        raise SystemExit(f"--model {spec!r}: {error}")
    return factory()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dtr_record", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="torchvision:NAME or MODULE:FACTORY")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=224, help="image side in pixels")
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=1, help="training steps recorded")
    parser.add_argument("--warmup", type=int, default=1, help="unrecorded steps first")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the trace file to write (.jsonl)")
    args = parser.parse_args(argv)
    for flag in ("batch", "image", "classes", "steps"):
        if getattr(args, flag) < 1:
            raise SystemExit(f"--{flag} must be at least 1")

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = build_model(args.model, args.classes).to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()

    def batch(_step):
        images = torch.randn(args.batch, 3, args.image, args.image, device=device)
        labels = torch.randint(0, args.classes, (args.batch,), device=device)
        return images, labels

    for step in range(args.warmup):
        images, labels = batch(step)
        loss_fn(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    recorder = record_training(model, batch, loss_fn, optimizer, args.out, steps=args.steps)
    applies = sum(1 for e in recorder.events if e.get("event") == "apply")
    print(f"{args.out}: {applies} ops, {len(recorder.events) - 1} events", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
