"""dtr: Dynamic Tensor Rematerialization, a Rust engine for training under a memory budget.

The PyTorch integration lives in :mod:`dtr.torch`::

    import dtr.torch
    with dtr.torch.budget("1GiB") as session:
        model(x).sum().backward()
    print(session.stats()["peak_bytes"])
"""

from __future__ import annotations

from typing import List, Tuple

from . import _native

__all__ = ["OutOfMemory", "heuristics", "parse_bytes"]

try:  # torch >= 2.5 names its out-of-memory error; older ones have only RuntimeError
    from torch import OutOfMemoryError as _OutOfMemoryBase
except ImportError:  # pragma: no cover - depends on the installed torch
    _OutOfMemoryBase = RuntimeError


class OutOfMemory(_OutOfMemoryBase):
    """No eviction can make room within the budget.

    Raised at the op that could not run; ``op`` names it, ``requested_bytes``
    is what it needed, ``budget_bytes`` and ``in_use_bytes`` what there was.
    Everything stays consistent: leave the ``budget`` context (every live
    tensor is restored) and retry under a larger budget.
    """

    def __init__(self, message: str, op: str = "", requested_bytes: int = 0,
                 budget_bytes: int = 0, in_use_bytes: int = 0) -> None:
        super().__init__(message)
        self.op = op
        self.requested_bytes = requested_bytes
        self.budget_bytes = budget_bytes
        self.in_use_bytes = in_use_bytes


def heuristics() -> List[Tuple[str, str]]:
    """``(name, description)`` of every eviction heuristic, as ``dtr heuristics`` lists them."""
    return list(_native.heuristics())


def parse_bytes(size: "int | str") -> int:
    """Bytes from an int or a string such as ``"1.5GiB"``, ``"800MB"`` or ``"4096"``
    (SI and binary units, as ``dtr replay --budget`` reads them).

    >>> parse_bytes("1.5KiB")
    1536
    """
    if isinstance(size, bool):
        raise TypeError("a size is an int of bytes or a string like '1.5GiB', not a bool")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"a size cannot be negative: {size}")
        return size
    if not isinstance(size, str):
        raise TypeError(f"a size is an int of bytes or a string like '1.5GiB', not {type(size).__name__}")
    return _native.parse_bytes(size)
