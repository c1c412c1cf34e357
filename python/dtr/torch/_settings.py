"""The global settings an ATen kernel reads besides its arguments: a
recomputation runs under those its first run saw.

A factory op called without a dtype reaches ATen without one and makes the
default dtype of the moment (`torch.set_default_dtype`); oneDNN, cuDNN and
cuBLAS switches and precisions, and deterministic algorithms, pick other
kernels whose last bits differ; flushing denormals to zero
(`torch.set_flush_denormal`) makes zeros of tiny values. A recomputation
after the program changed one of them would make other values (or, for the
dtype, another size). Autocast needs nothing here: it casts before the
dispatch mode sees an op.
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

import torch

_C = torch._C


def _apply(setter: Callable) -> Callable[[Any], None]:
    """A setter taking what its getter returns (some getters give tuples)."""
    return lambda value: setter(*value) if isinstance(value, tuple) else setter(value)


def _deterministic() -> Tuple[bool, bool]:
    return _C._get_deterministic_algorithms(), _C._get_deterministic_algorithms_warn_only()


def _set_deterministic(value: Tuple[bool, bool]) -> None:
    _C._set_deterministic_algorithms(value[0], warn_only=value[1])


class _FlushDenormal:
    """`torch.set_flush_denormal` has no getter: while a session is open,
    :func:`watch` puts a wrapper in its place that notes each change, and
    the state it starts from is measured (a product of a denormal)."""

    original = torch.set_flush_denormal
    flushing = False
    watchers = 0

    @classmethod
    def get(cls) -> bool:
        return cls.flushing

    @classmethod
    def set(cls, mode: bool) -> bool:
        supported = cls.original(mode)
        if supported:
            cls.flushing = bool(mode)
        return supported

    @classmethod
    def measure(cls) -> None:
        """Reads the state the program left, from a product that flushing
        makes zero (run with no dispatch mode on: see :func:`watch`)."""
        tiny = torch.tensor([1e-39], dtype=torch.float32, device="cpu")
        cls.flushing = bool((tiny * 1.0).item() == 0.0)


def watch() -> None:
    """A session opens: follow `torch.set_flush_denormal` (call with no
    dispatch mode on)."""
    if _FlushDenormal.watchers == 0:
        _FlushDenormal.measure()
        torch.set_flush_denormal = _FlushDenormal.set
    _FlushDenormal.watchers += 1


def unwatch() -> None:
    """A session closes: the last one puts `torch.set_flush_denormal` back."""
    _FlushDenormal.watchers -= 1
    if _FlushDenormal.watchers == 0:
        torch.set_flush_denormal = _FlushDenormal.original


def _settings() -> List[Tuple[Callable[[], Any], Callable[[Any], None]]]:
    """(getter, setter) of each setting this build has. Only the legacy
    switches: PyTorch 2.9's per-backend precisions (`fp32_precision`) are
    linked to them, and once a program mixes the two APIs the legacy
    getters raise, so writing through both would break the program's own
    reads. Under the new API a legacy getter raises and that setting is
    passed over (see `_UNREADABLE`)."""
    pairs = [
        (torch.is_grad_enabled, _C._set_grad_enabled),
        (torch.get_default_dtype, torch.set_default_dtype),
        (_deterministic, _set_deterministic),
        (_FlushDenormal.get, _FlushDenormal.set),
    ]
    for name in ("mkldnn_enabled", "mkldnn_deterministic", "cudnn_enabled", "cudnn_benchmark",
                 "cudnn_deterministic", "cudnn_allow_tf32", "cublas_allow_tf32",
                 "cublas_allow_fp16_reduced_precision_reduction",
                 "cublas_allow_bf16_reduced_precision_reduction", "float32_matmul_precision"):
        get, set_ = getattr(_C, f"_get_{name}", None), getattr(_C, f"_set_{name}", None)
        if get is not None and set_ is not None:
            pairs.append((get, _apply(set_)))
    return pairs


_SETTINGS = _settings()

# What a getter that raises reads as: never written back.
_UNREADABLE = object()


def _read(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except RuntimeError:
        return _UNREADABLE


_last: tuple = ()


def current() -> tuple:
    """The settings now, in the order of `_SETTINGS`: the same tuple while
    they stay the same, so that recorded calls share it."""
    global _last
    now = tuple(_read(get) for get, _ in _SETTINGS)
    if now != _last:
        _last = now
    return _last


class restored:
    """Runs a block under `settings` (from :func:`current`), then puts back
    those it changed."""

    __slots__ = ("settings", "changed")

    def __init__(self, settings: tuple) -> None:
        self.settings = settings
        self.changed: List[Tuple[Callable[[Any], None], Any]] = []

    def __enter__(self) -> None:
        for (get, set_), wanted in zip(_SETTINGS, self.settings):
            now = _read(get)
            if now != wanted and now is not _UNREADABLE and wanted is not _UNREADABLE:
                set_(wanted)
                self.changed.append((set_, now))

    def __exit__(self, *exc) -> None:
        for set_, before in reversed(self.changed):
            set_(before)
        self.changed.clear()
