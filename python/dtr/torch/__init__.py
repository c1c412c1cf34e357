"""Train stock PyTorch under a memory budget: ``dtr.torch.budget``.

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
"""

from __future__ import annotations

from typing import Union

import torch

from .. import OutOfMemory, heuristics, parse_bytes
from ._session import Session

__all__ = ["budget", "Session", "OutOfMemory"]


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
