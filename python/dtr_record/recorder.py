"""A ``TorchDispatchMode`` that writes every aten op as a dtr trace event.

What the trace holds (dtr trace format, version 2):

- ``put``: a tensor the program had before recording began, or one it made
  without an op (parameters, buffers, inputs, optimiser state), on its first
  use. Never evicted.
- ``apply``: one aten op, named as PyTorch names it (``aten.convolution.default``),
  with its tensor inputs, its outputs (shape, dtype, bytes of the storage it
  allocated) and its cost: measured time in nanoseconds (wall clock on the CPU,
  CUDA events on a GPU). An output that shares an input's storage (a view,
  ``detach``) is an alias of that input and allocates nothing. Ops carry no
  dtr kernel: the simulator replays them from sizes and costs.
- ``del``: when PyTorch frees the tensor. A weak reference's finalizer fires
  when the tensor's Python object dies; PyTorch keeps that object alive as
  long as C++ holds the tensor (autograd's saved tensors included), so this is
  when the tensor itself goes, not when the user's variable does.
- ``get``: an op that reads values to the host (``.item()``, ``equal``).
- In-place ops and ``out=`` arguments, copy-on-write as the DTR authors'
  simulator does: the op produces a new version of each storage it writes
  (same bytes), every live tensor on the old storage is re-made as an alias of
  the new version, and the old tensors are released. A new version stays a root
  (``detach``) when the old storage was one (parameters, running statistics) or
  when grad mode is off (optimiser steps), so updates do not grow history.
"""

from __future__ import annotations

import json
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
    torch.complex128: "c128",
}
for _name, _label in [("float8_e4m3fn", "f8e4m3"), ("float8_e5m2", "f8e5m2"),
                      ("uint16", "u16"), ("uint32", "u32"), ("uint64", "u64")]:
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _label


def dtype_name(dtype: torch.dtype) -> str:
    """The trace's name for a torch dtype (``other`` for the rest)."""
    return _DTYPES.get(dtype, "other")


def _storage_key(t: torch.Tensor) -> int:
    # The StorageImpl's address: an identity while the storage lives, which the
    # recorder only relies on while it tracks a live tensor on it.
    return t.untyped_storage()._cdata


def _tensors(tree: Any) -> List[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class _Storage:
    __slots__ = ("bytes", "tensors", "root")

    def __init__(self, nbytes: int, root: bool):
        self.bytes = nbytes
        self.tensors: Dict[int, int] = {}  # trace id -> id() of its Python object
        self.root = root


class TraceRecorder(TorchDispatchMode):
    """Records the aten ops run inside ``with TraceRecorder(path):``.

    The trace is written to ``path`` when the block ends; ``events`` holds it
    as dicts meanwhile. Tensors still alive at the end stay referenced.
    """

    def __init__(self, path: Optional[str] = None, *, cuda_timing: Optional[bool] = None):
        super().__init__()
        self.path = path
        self.cuda_timing = cuda_timing
        self.events: List[Dict[str, Any]] = [{"format": "dtr-trace", "version": 2}]
        self._next_id = 0
        self._ids: Dict[int, int] = {}  # id() of a live tensor -> its trace id
        self._storage_of: Dict[int, int] = {}  # trace id -> storage key
        self._storages: Dict[int, _Storage] = {}
        self._finalizers: Dict[int, weakref.finalize] = {}
        self._recording = False

    # -- the context -------------------------------------------------------

    def __enter__(self):
        self._recording = True
        return super().__enter__()

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        self._recording = False
        for finalizer in self._finalizers.values():
            finalizer.detach()
        self._finalizers.clear()
        if self.path is not None:
            self.write(self.path)
        return result

    def write(self, path: str) -> None:
        with open(path, "w") as out:
            for event in self.events:
                out.write(json.dumps(event, separators=(",", ":")))
                out.write("\n")

    # -- tensors -----------------------------------------------------------

    def _track(self, t: torch.Tensor, key: int) -> int:
        tid = self._next_id
        self._next_id += 1
        self._ids[id(t)] = tid
        self._storage_of[tid] = key
        self._storages[key].tensors[tid] = id(t)
        if id(t) not in self._finalizers:
            self._finalizers[id(t)] = weakref.finalize(t, self._released, id(t))
        return tid

    def _released(self, pyid: int) -> None:
        self._finalizers.pop(pyid, None)
        tid = self._ids.pop(pyid, None)
        if tid is None or not self._recording:
            return
        self._forget(tid)
        self.events.append({"event": "del", "id": tid})

    def _forget(self, tid: int) -> None:
        key = self._storage_of.pop(tid)
        storage = self._storages[key]
        storage.tensors.pop(tid, None)
        if not storage.tensors:
            del self._storages[key]

    @staticmethod
    def _describe(t: torch.Tensor) -> Dict[str, Any]:
        return {"dims": list(t.shape), "dtype": dtype_name(t.dtype)}

    def _alias(self, base: int, tid: int, t: Optional[torch.Tensor] = None) -> None:
        """An op-less view: ``tid`` shares ``base``'s storage."""
        output = {"id": tid, "bytes": 0, "alias_of": 0}
        if t is not None:
            output.update(self._describe(t))
        self.events.append({"event": "apply", "op": "alias", "inputs": [base],
                            "outputs": [output], "cost": 0})

    def _id_of(self, t: torch.Tensor) -> int:
        """The trace id of a tensor, adopting one made outside the recording."""
        tid = self._ids.get(id(t))
        if tid is not None:
            return tid
        key = _storage_key(t)
        storage = self._storages.get(key)
        if storage is not None:
            # A view, made without a recorded op, of a storage we track.
            base = min(storage.tensors)
            tid = self._track(t, key)
            self._alias(base, tid, t)
            return tid
        self._storages[key] = _Storage(t.untyped_storage().nbytes(), root=True)
        tid = self._track(t, key)
        self.events.append({"event": "put", "id": tid,
                            "bytes": self._storages[key].bytes, **self._describe(t)})
        return tid

    # -- ops ---------------------------------------------------------------

    def _time(self, func, args, kwargs, cuda: bool):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **kwargs)
            end.record()
            end.synchronize()
            return out, int(start.elapsed_time(end) * 1e6)
        started = time.perf_counter_ns()
        out = func(*args, **kwargs)
        return out, time.perf_counter_ns() - started

    @staticmethod
    def _written(func, args, kwargs) -> List[torch.Tensor]:
        """The tensors the op writes (``Tensor(a!)`` arguments)."""
        written = []
        for i, argument in enumerate(func._schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(argument.name)
            written.extend(_tensors(value))
        return written

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        input_ids = [self._id_of(t) for t in inputs]
        written = self._written(func, args, kwargs)
        cuda = self.cuda_timing if self.cuda_timing is not None else any(t.is_cuda for t in inputs)
        grad_enabled = torch.is_grad_enabled()
        out, cost = self._time(func, args, kwargs, cuda)
        outputs = _tensors(out)

        written_ids = {id(t) for t in written}
        fresh = [t for t in outputs if id(t) not in written_ids and id(t) not in self._ids]
        if not fresh and not written:
            for tid in dict.fromkeys(input_ids):
                self.events.append({"event": "get", "id": tid})
            return out

        op_inputs = list(input_ids)
        input_keys = [self._storage_of[tid] for tid in input_ids]
        specs: List[Dict[str, Any]] = []
        later_aliases = []  # (tensor, key of an output earlier in this op)
        made: Dict[int, int] = {}  # storage key -> index in specs, for fresh storages
        for t in fresh:
            key = _storage_key(t)
            if key in input_keys:
                specs.append({"tensor": t, "key": key, "bytes": 0, "alias_of": input_keys.index(key)})
            elif key in self._storages:
                # Shares a storage the op was not given: make that an input.
                op_inputs.append(min(self._storages[key].tensors))
                input_keys.append(key)
                specs.append({"tensor": t, "key": key, "bytes": 0, "alias_of": len(op_inputs) - 1})
            elif key in made:
                later_aliases.append((t, key))
            else:
                made[key] = len(specs)
                specs.append({"tensor": t, "key": key, "bytes": t.untyped_storage().nbytes()})
        # One new version per written storage (written tensors are inputs,
        # so their storages are tracked).
        versions: Dict[int, torch.Tensor] = {}
        for t in written:
            versions.setdefault(_storage_key(t), t)

        outputs_json = []
        for spec in specs:
            t = spec["tensor"]
            if "alias_of" not in spec:
                self._storages[spec["key"]] = _Storage(spec["bytes"], root=False)
            tid = self._track(t, spec["key"])
            entry = {"id": tid, "bytes": spec["bytes"], **self._describe(t)}
            if "alias_of" in spec:
                entry["alias_of"] = spec["alias_of"]
            outputs_json.append(entry)
        version_ids = []
        for key, t in versions.items():
            tid = self._next_id
            self._next_id += 1
            version_ids.append(tid)
            entry = {"id": tid, "bytes": self._storages[key].bytes, "dtype": dtype_name(t.dtype)}
            if t.untyped_storage().nbytes() == t.numel() * t.element_size() and t.storage_offset() == 0:
                entry["dims"] = list(t.shape)
            outputs_json.append(entry)
        self.events.append({"event": "apply", "op": str(func), "inputs": op_inputs,
                            "outputs": outputs_json, "cost": cost})

        for t, key in later_aliases:
            base = min(self._storages[key].tensors)
            self._alias(base, self._track(t, key), t)
        for key, version in zip(versions, version_ids):
            self._rebind(key, version, root=self._storages[key].root or not grad_enabled)
        return out

    def _rebind(self, key: int, version: int, root: bool) -> None:
        """Re-makes every live tensor on storage ``key`` as an alias of its
        new ``version`` and releases the old tensors."""
        storage = self._storages[key]
        if root:
            self.events.append({"event": "detach", "id": version})
        storage.root = root
        old = sorted(storage.tensors.items())
        for tid, pyid in old:
            new = self._next_id
            self._next_id += 1
            self._alias(version, new)
            self._ids[pyid] = new
            self._storage_of[new] = key
            storage.tensors[new] = pyid
            self._forget(tid)
            self.events.append({"event": "del", "id": tid})
        self.events.append({"event": "del", "id": version})


def record_training(
    model: torch.nn.Module,
    batch: Callable[[int], Iterable[Any]],
    loss_fn: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    path: str,
    steps: int = 1,
) -> TraceRecorder:
    """Records ``steps`` training steps of ``model``: for each step,
    ``inputs, target = batch(step)``, forward, ``loss_fn(output, target)``,
    backward, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``,
    and reads the loss. Returns the recorder (its ``events`` are the trace)."""
    recorder = TraceRecorder(path)
    with recorder:
        for step in range(steps):
            inputs, target = batch(step)
            loss = loss_fn(model(inputs), target)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss.item()
            del inputs, target, loss
    return recorder
