"""Train stock PyTorch under a memory budget (``dtr.torch.budget``), or
record its ops as a dtr trace (``dtr.torch.record``).

    import dtr.torch
    with dtr.torch.budget("1.5GiB") as session:
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward(); optimizer.step(); optimizer.zero_grad()
    print(session.stats())

Under the context every ATen op on the budgeted device goes through dtr's
Rust engine, which keeps the bytes of the storages it manages within the
budget by freeing storages and recomputing them when they are used again.
Losses and gradients are bitwise equal to an unbounded run.

    with dtr.torch.record("step.jsonl", model, optimizer):
        loss_fn(model(x), y).backward(); optimizer.step()

writes the same ops as a trace that ``dtr replay`` and ``dtr sweep`` run
under any budget and heuristic.
"""

from __future__ import annotations

import os
from typing import Iterable, List, Union

import torch

from .. import OutOfMemory, heuristics, parse_bytes
from ._session import Session

__all__ = ["budget", "record", "Session", "OutOfMemory"]


def budget(limit: Union[int, str, None], heuristic: str = "dtr",
           device: Union[torch.device, str, int, None] = None) -> Session:
    """A context manager that keeps PyTorch's tensor storages within ``limit`` bytes.

    ``limit``: an int of bytes, a string such as ``"1.5GiB"`` or ``"800MB"``,
    or ``None`` to track only (no eviction; ``stats()`` reports the peak).
    ``heuristic``: the eviction heuristic, any name of ``dtr.heuristics()``.
    ``device``: the device whose storages are budgeted; by default the
    device of the first tensor an op touches.

    Parameters, buffers, gradients and optimiser state are counted from
    their first use and never evicted; activations (autograd's saved
    tensors included) are. An impossible budget raises
    :class:`dtr.OutOfMemory`; leaving the context restores every live
    tensor, and the step can be retried under a larger budget.

    >>> with budget("64MiB") as session:
    ...     model(x).sum().backward()
    """
    budget_bytes = None if limit is None else parse_bytes(limit)
    known = [name for name, _ in heuristics()]
    if heuristic not in known:
        raise ValueError(f"unknown heuristic {heuristic!r}; known: {', '.join(known)}")
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return Session(budget_bytes, heuristic, device)


def record(path: Union[str, os.PathLike], *state: object,
           device: Union[torch.device, str, int, None] = None) -> Session:
    """A context manager that writes the ATen ops run under it to a dtr trace at ``path``.

    The trace (dtr's JSON-lines format, replayable with ``dtr replay``) is
    the program dtr's engine sees under :func:`budget`: one tensor per
    storage, an ``apply`` per op that makes storage (with its measured cost
    in nanoseconds and the module it ran in), a new version per in-place
    write under grad mode, ``del`` when PyTorch frees a storage, ``get``
    when the host reads values (``.item()``).

    ``state``: modules, optimizers and tensors that exist before the
    recording and persist (parameters, buffers, optimizer state): they are
    ``put`` at the start of the trace, so they count for the whole step.
    Tensors made outside and not named here are put at their first use;
    state made inside (lazily created optimizer state) is counted from its
    creation.

    >>> with dtr.torch.record("step.jsonl", model, optimizer):
    ...     loss_fn(model(x), y).backward(); optimizer.step()
    """
    if device is not None:
        device = torch.device(device)
    return Session(None, "dtr", device, trace_path=os.fspath(path),
                   keep=_persistent_tensors(state))


def _persistent_tensors(objects: Iterable[object]) -> List[torch.Tensor]:
    """The tensors of modules (parameters, buffers), optimizers (state) and tensors."""
    tensors: List[torch.Tensor] = []
    for obj in objects:
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
        elif isinstance(obj, torch.nn.Module):
            tensors.extend(obj.parameters())
            tensors.extend(obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            for group in obj.param_groups:
                tensors.extend(group["params"])
            for per_param in obj.state.values():
                tensors.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
        elif isinstance(obj, (list, tuple)):
            tensors.extend(_persistent_tensors(obj))
        else:
            raise TypeError(f"dtr.torch.record: state is modules, optimizers and tensors, "
                            f"not {type(obj).__name__}")
    return tensors
