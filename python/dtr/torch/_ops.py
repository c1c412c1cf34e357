"""What dtr needs to know of an ATen op, read once from its schema and tags."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

aten = torch.ops.aten

# Ops that write arguments their schema does not mark as written: batch
# norm its running statistics (`Tensor? running_mean`, no `(a!)`), and, in
# PyTorch 2.4, `rrelu_with_noise` the noise it draws (newer schemas say
# `Tensor(b!) noise`). The written positions, and the position
# of `training`, which must be true for the write to happen (None: always).
_HIDDEN_WRITES: Dict[str, Tuple[Tuple[int, ...], Optional[int]]] = {
    "aten::native_batch_norm": ((3, 4), 5),
    "aten::cudnn_batch_norm": ((3, 4), 5),
    "aten::miopen_batch_norm": ((3, 4), 5),
    "aten::rrelu_with_noise": ((1,), 4),
    # `torch.batch_norm_update_stats`, and SyncBatchNorm's statistics (CUDA).
    "aten::batch_norm_update_stats": ((1, 2), None),
    "aten::batch_norm_gather_stats": ((3, 4), None),
    "aten::batch_norm_gather_stats_with_counts": ((3, 4), None),
}

# Ops whose fresh outputs do not depend on the constants they update (batch
# norm's outputs in training use the batch's statistics, not the running
# ones), so the outputs stay recomputable: a recomputation writes its
# updates to scratch copies.
_SIDE_EFFECT_ONLY_WRITES = {
    "aten::native_batch_norm",
    "aten::cudnn_batch_norm",
    "aten::miopen_batch_norm",
    "aten::_native_batch_norm_legit",
    "aten::_batch_norm_with_update",
    "aten::batch_norm_update_stats",
    "aten::batch_norm_gather_stats",
    "aten::batch_norm_gather_stats_with_counts",
}


# Ops whose outputs hold whatever the allocator left: C++ code then fills
# them with no op the dispatch mode sees (`at::tensor(list)`, which
# `ctc_loss` uses for its lengths, copies the list in raw), so re-running
# one does not give back the bytes that were read.
_UNINITIALIZED = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
    "aten::new_empty", "aten::new_empty_strided",
}

# The positions of arguments that ops overwrite without reading them:
# `self` of in-place fills, and the noise `rrelu` draws into (`F.rrelu`
# passes it `torch.empty_like(input)`).
_OVERWRITTEN: Dict[str, Tuple[int, ...]] = {
    **{name: (0,) for name in (
        "aten::fill_", "aten::zero_", "aten::copy_", "aten::uniform_", "aten::normal_",
        "aten::bernoulli_", "aten::random_", "aten::exponential_", "aten::cauchy_",
        "aten::log_normal_", "aten::geometric_")},
    "aten::rrelu_with_noise": (1,),
}


class OpInfo:
    """One op overload: which arguments it writes, and whether it draws random numbers."""

    __slots__ = ("name", "writes", "hidden_writes", "training_arg", "training_name", "seeded",
                 "nondeterministic", "side_effect_only_writes", "uninitialized", "overwrites",
                 "view")

    def __init__(self, func: torch._ops.OpOverload) -> None:
        schema = func._schema
        self.name = str(func)
        # (position or None for keyword-only, name) of every argument written.
        self.writes = tuple(
            (None if arg.kwarg_only else position, arg.name)
            for position, arg in enumerate(schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write
        )
        positions, training = _HIDDEN_WRITES.get(schema.name, ((), None))
        # (position, name) of every argument written unannounced.
        self.hidden_writes = tuple((p, schema.arguments[p].name) for p in positions)
        self.training_arg = training
        self.training_name = schema.arguments[training].name if training is not None else ""
        tags = getattr(func, "tags", ())
        self.seeded = torch.Tag.nondeterministic_seeded in tags
        self.nondeterministic = torch.Tag.nondeterministic_bitwise in tags
        self.side_effect_only_writes = schema.name in _SIDE_EFFECT_ONLY_WRITES
        self.uninitialized = schema.name in _UNINITIALIZED
        # It returns views of its arguments: it reads no values.
        self.view = any(r.alias_info is not None and not r.alias_info.is_write
                        for r in schema.returns)
        # (position or None, name) of the arguments written without being
        # read: `out=` arguments, and those of `_OVERWRITTEN`.
        overwritten = _OVERWRITTEN.get(schema.name, ())
        self.overwrites = tuple(
            (None if arg.kwarg_only else position, arg.name)
            for position, arg in enumerate(schema.arguments)
            if getattr(arg, "is_out", False) or position in overwritten
        )

    def overwritten(self, args: tuple, kwargs: dict) -> list:
        """The arguments this call overwrites without reading them."""
        return [args[position] if position is not None and position < len(args)
                else kwargs.get(name) for position, name in self.overwrites]

    def written(self, args: tuple, kwargs: dict) -> list:
        """The arguments this call writes (tensors, lists of tensors or None)."""
        found = []
        for position, name in self.writes:
            if position is not None and position < len(args):
                found.append(args[position])
            elif name in kwargs:
                found.append(kwargs[name])
        if self.hidden_writes:
            training = (True if self.training_arg is None
                        else args[self.training_arg] if len(args) > self.training_arg
                        else kwargs.get(self.training_name, False))
            if training:
                found.extend(args[p] if p < len(args) else kwargs.get(name)
                             for p, name in self.hidden_writes)
        return found


_INFO: Dict[object, OpInfo] = {}


def op_info(func) -> OpInfo:
    info = _INFO.get(func)
    if info is None:
        info = _INFO[func] = OpInfo(func)
    return info
