"""A budget session: PyTorch's ATen calls, seen by a dispatch mode, driven by the Rust engine.

How it works, in one place:

- Every torch storage on the budgeted device that an op touches gets a
  :class:`_Slot`, and the engine a tensor for its current value. Storages
  made outside the session (parameters, inputs, optimiser state from an
  earlier step) are *adopted* on first use as constants, never evicted.
  Views share their base's storage and slot: accounting is per storage.
- An op runs for real first (its inputs made resident), then the engine is
  told (``Engine.apply``): it makes room for the outputs by evicting, and
  keeps the call as the outputs' compute history.
- Evicting frees for real: the storage is resized to zero bytes, so every
  tensor, view and autograd saved tensor on it keeps its metadata and version
  counter but loses its memory. Rematerialising re-runs the recorded call on
  the engine's input buffers and swaps the fresh data pointer into the
  original storage (no copy), so everything that held it sees the value again.
- In place writes: under grad mode, to a recomputable storage, they make a
  new version in the engine (the old one stays as history, recomputed into a
  scratch buffer when needed). Writes to constants, and writes with grad off
  (optimiser steps, gradient accumulation), first make every live tensor whose
  recomputation would read the old value a constant; the target stays (or
  becomes) a constant, so parameters, gradients and optimiser state are pinned
  and history never spans steps.
- Random ops keep the generator state they started from; a recomputation
  restores it for the call and puts the generator back where it was.

Deaths of storages arrive through weak references at any time; they are
queued and handed to the engine at the next op, never re-entering it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.utils.dlpack
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _disable_current_modes,
    _get_current_dispatch_mode_stack,
)
from torch.utils._pytree import tree_flatten
from torch.utils.module_tracker import ModuleTracker

from .. import OutOfMemory, _native
from . import _settings
from ._ops import _INFO, op_info

_Tensor = torch.Tensor
_TensorBase = torch._C.TensorBase
_Parameter = torch.nn.Parameter
_NO_SUBCLASS_FUNCTION = torch._C.DisableTorchFunctionSubclass
_STRIDED = torch.strided
_SEQUENCES = (list, tuple)
_perf_ns = time.perf_counter_ns


class _Slot:
    """One torch storage under the session: the engine tensor of its current value."""

    __slots__ = ("key", "ref", "handle", "nbytes", "buf", "resident", "constant", "readers",
                 "shared", "copy", "copy_storage", "unfilled", "only_history")

    def __init__(self, key: int, nbytes: int) -> None:
        self.key = key
        self.ref: Optional[weakref.ref] = None
        self.handle: int = 0
        self.nbytes = nbytes
        self.buf = _Buf(self)
        self.resident = True
        self.constant = False
        # Recorded calls that read this (recomputable) storage: they keep it
        # alive once it becomes a constant, since it cannot be recomputed.
        self.readers: List["_Call"] = []
        # Memory PyTorch did not allocate (`torch.from_numpy`, DLPack): the
        # host may write it with no op the session sees, so recorded calls
        # read `copy`, a constant copy of its bytes as they were when the
        # call ran (see `Session._copy_of`).
        self.shared = False
        self.copy: Optional["_Slot"] = None
        self.copy_storage: Optional[torch.UntypedStorage] = None
        # Made by an op that leaves its memory uninitialised (`empty`), and
        # read by no op since: see `Session._reading_unfilled`.
        self.unfilled = False
        # A constant whose storage only recorded calls keep alive, its handle
        # handed to the engine as history (see
        # `Session._hand_over_what_only_history_holds`).
        self.only_history = False

    def storage(self) -> Optional[torch.UntypedStorage]:
        """The torch storage, or None once it has died. One reached through
        the weak reference is handed back to Python (``_fix_weakref``):
        older PyTorch (2.4, the oldest supported, does) otherwise frees its
        Python object when this reference goes, though the storage lives on,
        and the weak reference dies with it."""
        storage = self.ref() if self.ref is not None else None
        if storage is not None:
            storage._fix_weakref()
        return storage


class _Buf:
    """The engine's buffer for one version of a slot's value: the storage
    itself while that version is current (``owns``), nothing after."""

    __slots__ = ("slot", "owns")

    def __init__(self, slot: _Slot) -> None:
        self.slot = slot
        self.owns = True


class _Arg:
    """A tensor argument of a recorded call: input ``index`` seen through a view."""

    __slots__ = ("index", "dtype", "size", "stride", "offset", "conj", "neg")

    def __init__(self, index: int, tensor: _Tensor) -> None:
        self.index = index
        if type(tensor) is _Tensor or type(tensor) is _Parameter:
            self.dtype = tensor.dtype
            self.size = tuple(tensor.shape)
            self.stride = tensor.stride()
            self.offset = tensor.storage_offset()
            # Lazy views: `a.mH` (conjugate bit), `a.conj().imag` (negative
            # bit) read the storage's values conjugated or negated.
            self.conj = tensor.is_conj()
            self.neg = tensor.is_neg()
            return
        # A subclass may override the metadata (an uninitialised lazy
        # parameter raises on `.shape`): the tensor's own, as ATen sees it.
        with _NO_SUBCLASS_FUNCTION():
            self.dtype = _TensorBase.dtype.__get__(tensor)
            self.size = tuple(_TensorBase.size(tensor))
            self.stride = _TensorBase.stride(tensor)
            self.offset = _TensorBase.storage_offset(tensor)
            self.conj = _TensorBase.is_conj(tensor)
            self.neg = _TensorBase.is_neg(tensor)

    def over(self, storage: torch.UntypedStorage) -> _Tensor:
        empty = torch.empty((0,), dtype=self.dtype, device=storage.device)
        tensor = empty.set_(storage, self.offset, self.size, self.stride)
        if self.conj:
            tensor = tensor.conj()
        if self.neg:
            tensor = torch._neg_view(tensor)
        return tensor


class _Call:
    """What re-running one op needs: the op, its arguments with tensors as
    :class:`_Arg`, where each engine output comes from, and its RNG state."""

    __slots__ = ("func", "args", "kwargs", "sources", "slots", "handles",
                 "rng", "copied_inputs", "scratch_inputs", "keep", "live", "settings")

    def __init__(self, func, args, kwargs, sources, slots, copied_inputs, scratch_inputs, rng):
        self.func = func
        self.args = args
        self.kwargs = kwargs
        # Per engine output: ≥ 0, that position of the flattened result; < 0,
        # input -1-k written in place.
        self.sources = sources
        self.slots = slots
        self.handles: List[int] = []
        self.rng = rng
        self.copied_inputs = copied_inputs
        self.scratch_inputs = scratch_inputs
        # The constant inputs' storages: a constant cannot be recomputed, so
        # its memory stays while a call that may re-run reads it.
        self.keep: List[torch.UntypedStorage] = []
        self.live = True
        # Kernels read grad mode (mkldnn's RNN returns its workspace only
        # with it on), the default dtype and backend switches: a re-run
        # sees what the first run saw.
        self.settings = _settings.current()


def _is_index(tensor: _Tensor) -> bool:
    """Whether a tensor holds integers or booleans (see `_INDEX_BYTES`)."""
    return not (tensor.is_floating_point() or tensor.is_complex())


def _is_position_list(tensor: _Tensor) -> bool:
    """Whether a tensor may be a list of sizes or positions (see
    `_INDEX_BYTES`): 64- or 32-bit integers, one dimension. Not bytes: an
    op's workspace (`mkldnn_rnn_layer`'s, megabytes) is a list of bytes."""
    return tensor.dim() <= 1 and tensor.dtype in (torch.int64, torch.int32)


_CSR_LIKE = (torch.sparse_csr, torch.sparse_bsr)
_CSC_LIKE = (torch.sparse_csc, torch.sparse_bsc)


def _parts(tensor: _Tensor) -> tuple:
    """The strided tensors a sparse, nested or quantized tensor is made of
    (called inside the dispatch mode's handler, where ops run untracked). A
    nested or quantized tensor keeps what a recomputation could not rebuild
    from its storage alone (its tensors' sizes; its scale and zero point)."""
    layout = tensor.layout
    if layout is torch.sparse_coo:
        return tensor._indices(), tensor._values()
    if layout in _CSR_LIKE:
        return tensor.crow_indices(), tensor.col_indices(), tensor.values()
    if layout in _CSC_LIKE:
        return tensor.ccol_indices(), tensor.row_indices(), tensor.values()
    if layout is torch.jagged:  # a Python subclass holding its parts
        parts = (tensor._values, tensor._offsets, getattr(tensor, "_lengths", None))
        return tuple(part for part in parts if isinstance(part, _Tensor))
    if tensor.is_nested or tensor.is_quantized:  # one buffer, seen as bytes
        buffer = torch.empty((0,), dtype=torch.uint8, device=tensor.device)
        return (buffer.set_(_storage_of(tensor)),)
    return ()


def _holds_no_memory(storage: torch.UntypedStorage) -> bool:
    """A tensor wrapper's storage (functorch's transforms, forward-mode AD,
    `_make_wrapper_subclass` subclasses): sized, but with no memory of its
    own, so there is nothing to count, evict or recompute."""
    try:
        storage.data_ptr()
    except RuntimeError:  # "an invalid python storage": PyTorch's own name for it
        return True
    return False


def _same_bytes(a: torch.UntypedStorage, b: torch.UntypedStorage) -> bool:
    if a.nbytes() != b.nbytes():
        return False
    empty = torch.empty((0,), dtype=torch.uint8, device=a.device)
    return torch.equal(empty.set_(a), torch.empty_like(empty).set_(b))


def _flatten(value: Any, out: list) -> list:
    if isinstance(value, (tuple, list)):
        for item in value:
            _flatten(item, out)
    else:
        out.append(value)
    return out


def _rebuild(template: Any, storages: list) -> Any:
    if type(template) is _Arg:
        return template.over(storages[template.index])
    if isinstance(template, (tuple, list)):
        return type(template)(_rebuild(item, storages) for item in template)
    return template


def _generator(args: tuple, kwargs: dict) -> torch.Generator:
    """The generator a random op draws from: its own (`generator=`, or
    positional where the schema puts it there: `poisson`, `binomial`,
    `_standard_gamma`), else its device's default."""
    generator = kwargs.get("generator")
    if generator is None:
        generator = next((arg for arg in args if isinstance(arg, torch.Generator)), None)
    if generator is not None:
        return generator
    device = kwargs.get("device")
    if device is None:
        for arg in args:
            if isinstance(arg, _Tensor):
                device = arg.device
                break
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


class _Mode(TorchDispatchMode):
    def __init__(self, session: "Session") -> None:
        super().__init__()
        self.session = session

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        session = self.session
        if not session._guards_host_reads:
            return session._dispatch(func, args, kwargs or {})
        # Host reads made by the op itself (a kernel written in Python) are
        # the op's: its inputs are resident.
        session._busy += 1
        try:
            return session._dispatch(func, args, kwargs or {})
        finally:
            session._busy -= 1


# A rematerialised storage takes the fresh one's memory without a copy where
# PyTorch can swap two storages' data (newer releases; 2.11 cannot); else its
# data is copied in, and both copies exist for a moment.
_SWAPS_DATA_PTR = hasattr(torch.UntypedStorage, "_swap_data_ptr_")

# The storage of a tensor, by the method itself: `Tensor.untyped_storage`
# is wrapped while a budget is open (below), and the session's own lookups
# are no host reads.
_storage_of = torch._C.TensorBase.untyped_storage

# How the host reaches a storage's memory without an ATen op, so that the
# dispatch mode never sees it: it reads it (_READ), hands it out (_KEEP) or
# writes it (_WRITE).
_READ, _KEEP, _WRITE = "read", "keep", "write"

# Tensor methods that reach a storage's memory so. The storage object itself
# is memory handed out: `torch.save` (pickling), `bytes()`, `.tolist()` of a
# storage and NumPy's buffer read it later, after other ops may have run, so
# a tensor whose storage is taken stays resident for good. `copy.deepcopy`
# copies the storage at once (its `copy_` is an op). `apply_`, `map_` and
# `map2_` run a Python function over the elements in place, reading the
# other tensors they are given.
_HOST_ACCESS = {"tolist": _READ, "numpy": _KEEP, "__array__": _KEEP, "__dlpack__": _KEEP,
                "data_ptr": _KEEP, "untyped_storage": _KEEP, "storage": _KEEP,
                "_typed_storage": _KEEP, "__deepcopy__": _READ,
                "apply_": _WRITE, "map_": _WRITE, "map2_": _WRITE}

# Functions that hand out a tensor's memory, called through their modules:
# the function form of `__dlpack__` is a C function that calls no method.
# (A name imported from them before the budget opens is the bare function,
# which the session cannot see.)
_HOST_ACCESS_FUNCTIONS = ((torch, "to_dlpack"), (torch.utils.dlpack, "to_dlpack"))


# Index tensors (integer or boolean) are kept as constants from their making
# when they have at most this many bytes, or are lists of 32- or 64-bit
# integers of any length (`_is_position_list`): on the CPU some of
# PyTorch's C++ kernels read them straight from memory, inside ops that
# decompose before the session sees them (a packed sequence's `batch_sizes`
# in `pad_packed_sequence` and in `pack_padded_sequence`'s backward,
# `tensor_split`'s index tensor: the batch sizes of 3,000 time steps take
# 24 KB), and an evicted one was read as garbage. On CUDA those live on the host, outside the
# budget. Freeing one would gain next to nothing; small activations, by
# contrast, are most of a small model's memory and stay evictable.
_INDEX_BYTES = 16 * 1024


# A budget under which recomputation has cost this many times the compute of
# every op's first run raises `dtr.OutOfMemory` rather than going on: it
# recomputes the same history over and over (a storage written in place one
# slice per time step, as a hand-written recurrent cell may, chains every
# version of it) and would never finish. Healthy budgets cost under 2×.
_REMAT_RATIO_LIMIT = 50.0


class _HostReads:
    """While a budget session is open, ``torch.Tensor``'s host-access methods
    are wrapped: an evicted storage is made resident before the host reads
    it, and one whose memory the host takes (a NumPy array, a pointer, the
    storage object) is pinned for good, since eviction would free memory the
    host still uses.

    Wrapped methods, not a ``TorchFunctionMode``: any torch function mode
    makes ``has_torch_function`` true, and PyTorch then skips its fused fast
    paths (``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` in
    evaluation), whose results differ in the last bits from the slow ones."""

    sessions: List["Session"] = []
    saved: Dict[str, Any] = {}
    saved_functions: List[tuple] = []  # (module, name, the function)
    local = threading.local()

    @classmethod
    def enter(cls, session: "Session") -> None:
        if not cls.sessions:
            for name, access in _HOST_ACCESS.items():
                cls.saved[name] = _Tensor.__dict__.get(name)
                setattr(_Tensor, name, cls._wrap(getattr(_Tensor, name), access))
            for module, name in _HOST_ACCESS_FUNCTIONS:
                function = getattr(module, name, None)
                if function is not None:
                    cls.saved_functions.append((module, name, function))
                    setattr(module, name, cls._wrap(function, _KEEP))
        cls.sessions.append(session)

    @classmethod
    def exit(cls, session: "Session") -> None:
        if session in cls.sessions:
            cls.sessions.remove(session)
        if not cls.sessions:
            for name, original in cls.saved.items():
                if original is None:
                    delattr(_Tensor, name)  # it was inherited from TensorBase
                else:
                    setattr(_Tensor, name, original)
            cls.saved.clear()
            for module, name, function in cls.saved_functions:
                setattr(module, name, function)
            cls.saved_functions.clear()

    @classmethod
    def _wrap(cls, original, access: str):
        sessions = cls.sessions
        local = cls.local

        def method(self, *args, **kwargs):
            # Only the outermost: `__deepcopy__` reads the storage through
            # `_typed_storage` and copies it at once; nothing is handed out.
            if getattr(local, "depth", 0):
                return original(self, *args, **kwargs)
            reached = [(self, access)]
            if access is _WRITE:  # `map_` and `map2_` read their other tensors
                reached += [(arg, _READ) for arg in args if isinstance(arg, _Tensor)]
            reading = []  # (session, the slot it pinned for this read)
            try:
                for session in reversed(sessions):
                    for tensor, how in reached:
                        reading.append((session, session._host_access(tensor, how)))
                local.depth = 1
                return original(self, *args, **kwargs)
            finally:
                local.depth = 0
                for session, slot in reading:
                    if slot is not None:
                        session._host_read_done(slot)

        method.__name__ = getattr(original, "__name__", "method")
        method.__doc__ = getattr(original, "__doc__", None)
        method.__wrapped__ = original
        return method


def _without_leaves(tree) -> list:
    """The values of `tree` but leaf tensors (those no op made)."""
    values, _ = tree_flatten(tree)
    return [value for value in values
            if not (isinstance(value, _Tensor) and value.grad_fn is None)]


class _ModuleNames(ModuleTracker):
    """PyTorch's module tracker, which names the module each op of a recorded
    trace runs in, without its backward hook on leaf tensors. That hook asks
    whether the backward pass will reach the leaf, which
    `torch.autograd.grad` refuses to answer ("A leaf node was passed to
    _will_engine_execute_node"): a step that takes the gradient of its loss
    with respect to a model's input (an input-gradient penalty) failed to
    record. A backward pass ends at its leaves, and its end resets the
    names, so the hook is not missed."""

    def _fw_pre_hook(self, mod, input) -> None:
        super()._fw_pre_hook(mod, _without_leaves(input))

    def _fw_post_hook(self, mod, input, output) -> None:
        super()._fw_post_hook(mod, input, _without_leaves(output))


class Session:
    """One ``dtr.torch.budget`` context: the engine, the slots, the recorded calls.

    >>> with dtr.torch.budget("1GiB") as session:
    ...     loss = model(x).sum(); loss.backward()
    >>> session.stats()["peak_bytes"] <= 2**30
    True
    """

    def __init__(self, budget_bytes: Optional[int], heuristic: str,
                 device: Optional[torch.device], trace_path: Optional[str] = None,
                 keep: Sequence[_Tensor] = ()) -> None:
        self.budget_bytes = budget_bytes
        self.heuristic = heuristic
        self.device = device
        self._engine: Optional[_native.Engine] = _native.Engine(
            self, budget_bytes, heuristic, remat_ratio_limit=_REMAT_RATIO_LIMIT)
        self._slots: Dict[int, _Slot] = {}
        self._slot_of_handle: Dict[int, _Slot] = {}
        self._calls: Dict[int, _Call] = {}
        self._next_call = 1
        # The least time measured per (op, output sizes, input sizes).
        self._least_costs: Dict[tuple, int] = {}
        self._deaths: List[_Slot] = []
        # How many live slots are `unfilled`.
        self._unfilled = 0
        # Bytes of the copies made for history (`_copy_for_history`) still alive.
        self._history_copy_bytes = 0
        self._grad_hooks: list = []
        self._ops = 0
        self._remat_ns = 0
        self._closed_stats: Optional[dict] = None
        # Unbounded sessions never evict, so they never re-run a call.
        self._recording = budget_bytes is not None
        self._mode = _Mode(self)
        # Only a budget evicts: unbounded sessions need no guard on host reads.
        self._guards_host_reads = budget_bytes is not None
        self._busy = 0  # inside an op: host reads are the op's own
        # Writing a trace: where, what exists from its start, and which
        # module each op runs in.
        self._trace_path = trace_path
        self._keep = keep
        self._modules: Optional[ModuleTracker] = None

    # ----- the context -----------------------------------------------------

    def __enter__(self) -> "Session":
        if self._engine is None:
            raise RuntimeError("a dtr session cannot be entered twice")
        if self.budget_bytes is not None and any(
                isinstance(mode, _Mode) and mode.session.budget_bytes is not None
                for mode in _get_current_dispatch_mode_stack()):
            # Both would evict and recompute the same storages, each
            # unaware of the other's evictions: wrong values, silently.
            raise RuntimeError(
                "dtr.torch.budget: a budget is already in force here and budgets do not "
                "nest; leave it first (a session without a limit may be nested)")
        if self._trace_path is not None:
            self._engine.record(self._trace_path)
            for tensor in self._keep:
                self._track(tensor)
            self._modules = _ModuleNames().__enter__()
        if self._recording:
            # Recomputations restore the settings of first runs: follow
            # those PyTorch gives no getter for.
            with _disable_current_modes():
                _settings.watch()
        if self._guards_host_reads:
            _HostReads.enter(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        if self._guards_host_reads:
            _HostReads.exit(self)
        if self._recording:
            _settings.unwatch()
        if self._modules is not None:
            self._modules.__exit__(*exc)
            self._modules = None
        self._close()

    def _close(self) -> None:
        """Restores every live storage, so tensors stay valid after the context."""
        engine = self._engine
        if engine is None:
            return
        self._drain()
        trace_error: Optional[OSError] = None
        if self._trace_path is not None:
            try:
                engine.finish_record()
            except OSError as error:  # raised once the session is closed
                trace_error = error
        # The figures of the context itself; restoring what escapes it is
        # done without a budget, as stock PyTorch would hold it.
        self._closed_stats = self.stats()
        engine.set_budget(None)
        for slot in list(self._slots.values()):
            if not (slot.resident or slot.only_history) and slot.storage() is not None:
                engine.ensure_resident(slot.handle)
        for hook in self._grad_hooks:
            hook.remove()
        self._grad_hooks.clear()
        self._slots.clear()
        self._slot_of_handle.clear()
        for call in self._calls.values():
            call.keep.clear()
        self._calls.clear()
        self._engine = None
        if trace_error is not None:
            raise trace_error

    def stats(self) -> dict:
        """The session's figures: ``peak_bytes``, ``budget_bytes``, ``evictions``,
        ``rematerializations``, ``remat_seconds``, ``ops``, ``constant_peak_bytes``
        (the most bytes constants — parameters, gradients, optimiser state — held
        at once) and more."""
        if self._engine is None and self._closed_stats is not None:
            return dict(self._closed_stats)
        assert self._engine is not None
        stats = dict(self._engine.stats())
        stats["budget_bytes"] = self.budget_bytes
        stats["ops"] = self._ops
        stats["remat_seconds"] = self._remat_ns / 1e9
        stats["tracked_storages"] = len(self._slots)
        return stats

    def mark_step(self) -> None:
        """Ends a training step. While the program repeats it, the next steps
        make this step's evictions by plan, with no policy; a step that departs
        from the plan falls back to the policy and becomes the next plan. Where
        only the memory differs (the plan's room falls short), the policy
        repairs that request and the step goes on following.
        ``stats()["planned_steps"]`` counts the steps that followed a plan,
        ``stats()["plan_repairs"]`` the requests repaired. Under
        ``heuristic="dtr-next"`` the next step also knows, from this one, when
        each tensor is next read, and evicts by that foresight; only such a
        step's evictions become a plan. Tensors still alive at the mark are
        the next step's starting state: they become constants (resident,
        never evicted, their history dropped)."""
        if self._engine is None:
            raise RuntimeError("the dtr session is closed")
        self._drain()
        self._hand_over()
        self._engine.mark_step()

    def _hand_over(self) -> None:
        """What outlives a step is state the next one starts from
        (parameters a functional loop replaces out of place, a hidden state
        carried on, logged outputs): each becomes a constant, as the
        optimiser's state is, so no step's history reaches into the steps
        before it. Else the history of every step stays while such a tensor
        lives (the engine's tracked tensors grew each step), and
        recomputing it reruns earlier steps: a `torch.func` training loop
        under `dtr-next` recomputed back through them until it gave up."""
        carried = [slot for slot in self._slots.values() if not slot.constant]
        if not carried:
            return
        # Restoring one may re-run ops: not through the session's own mode.
        with _disable_current_modes():
            for slot in carried:
                if self._slots.get(slot.key) is slot and slot.storage() is not None:
                    self._detach(slot, "", "keeping what a step hands to the next")
        self._drain()

    def check(self) -> None:
        """Checks the engine's invariants (for tests)."""
        if self._engine is not None:
            self._drain()
            self._engine.check_invariants()

    # ----- storages --------------------------------------------------------

    def _track(self, tensor: _Tensor, op: str = "") -> Optional[_Slot]:
        """The tensor's slot, adopting its storage as a constant when new;
        None for tensors outside the budget (other devices, meta) and for
        sparse, nested and quantized ones (see :meth:`_parts_of`)."""
        device = tensor.device
        if device != self.device:
            if self.device is not None or device.type == "meta":
                return None
            self.device = device
        if tensor.layout is not _STRIDED or tensor.is_nested or tensor.is_quantized:
            return None
        storage = _storage_of(tensor)
        slot = self._slots.get(storage._cdata)
        if slot is None:
            if _holds_no_memory(storage):
                return None
            slot = self._new_slot(storage)
            # A storage PyTorch cannot resize holds memory it did not
            # allocate: `torch.from_numpy`, `frombuffer`, `from_dlpack`. Not
            # parameters: those in such memory are mapped weight files
            # (`from_pretrained`'s safetensors, `torch.load(mmap=True)`),
            # written only by ops the session sees (the optimiser's), and a
            # copy of each would hold every weight twice.
            slot.shared = not (storage.resizable() or isinstance(tensor, _Parameter))
            self._adopt_new(slot, op, "adopting a tensor made outside dtr")
            if tensor.requires_grad and tensor.is_leaf:
                self._grad_hooks.append(tensor.register_post_accumulate_grad_hook(self._pin_grad))
        return slot

    def _parts_of(self, tensor: _Tensor, op: str) -> List[_Slot]:
        """The slots of the strided storages a sparse, nested or quantized
        tensor is made of (its values and indices, or its one buffer), kept as
        constants: ops on such a tensor are not tracked as reading them, so
        none may be evicted (they are adopted as constants when new, made
        constants otherwise). Listed as inputs of the ops that read them, an
        in-place write to one preserves what was computed from them."""
        slots = []
        for part in _parts(tensor):
            slot = self._track(part, op)
            if slot is None:
                continue
            if not slot.constant:
                self._detach(slot, op, "keeping what a sparse, nested or quantized tensor "
                             "is made of")
            slots.append(slot)
        return slots

    def _adopt(self, slot: _Slot, op: str, what: str) -> None:
        """Has the engine track `slot`'s buffer as a constant of
        `slot.nbytes`, under a new handle (for ATen op `op`, doing `what`)."""
        slot.constant = True
        slot.readers = None
        slot.handle = self._engine_call(self._engine.adopt, op, what, slot.nbytes, slot.buf)
        self._slot_of_handle[slot.handle] = slot

    def _adopt_new(self, slot: _Slot, op: str, what: str) -> None:
        """`_adopt` for a slot just made by `_new_slot`: if the engine
        refuses it (out of memory), the slot is forgotten, so that neither a
        later lookup nor the storage's death reaches a tensor the engine never
        made."""
        try:
            self._adopt(slot, op, what)
        except BaseException:
            self._forget_new_slot(slot)
            raise

    def _readopt(self, slot: _Slot, nbytes: int, op: str) -> int:
        """A constant's storage changed size in place: the engine adopts it
        again at its new size; returns the old tensor's handle, for the caller
        to release once unpinned (releasing it frees nothing: the old buffer
        no longer owns the storage)."""
        old = slot.handle
        slot.buf.owns = False
        del self._slot_of_handle[old]
        slot.nbytes = nbytes
        slot.buf = _Buf(slot)
        self._adopt(slot, op, "counting a resized storage")
        return old

    def _keep_as_written(self, slot: _Slot, op: str) -> None:
        """An op that writes `slot` in place raised (and its inputs are
        unpinned): its bytes, as the op left them, become a new version, a
        constant. The version before the op stays history, recomputed for
        whatever still needs it (its readers get the recomputed value, not
        these bytes)."""
        if not (slot.resident and slot.buf.owns):
            return  # evicted: the op wrote nothing here
        old = slot.handle
        slot.buf.owns = False
        del self._slot_of_handle[old]
        self._engine.release(old)  # frees its bytes first: the budget holds the new version
        slot.buf = _Buf(slot)
        self._adopt(slot, op, "keeping what it wrote before it failed")

    def _pin_grad(self, param: _Tensor) -> None:
        """A parameter's gradient is a constant from accumulation on: the
        optimiser reads it after the activations it came from are gone."""
        grad = param.grad
        if self._engine is None or grad is None:
            return
        slot = self._track(grad)
        if slot is not None and not slot.constant:
            with self._outside_dispatch(slot):
                self._detach(slot, "", "keeping a gradient")

    def _new_slot(self, storage: torch.UntypedStorage) -> _Slot:
        slot = _Slot(storage._cdata, storage.nbytes())
        slots, deaths = self._slots, self._deaths

        def died(_ref, slot=slot, slots=slots, deaths=deaths):
            # The storage is gone: its address may be reused at once.
            if slots.get(slot.key) is slot:
                del slots[slot.key]
            deaths.append(slot)

        slot.ref = weakref.ref(storage, died)
        self._slots[slot.key] = slot
        return slot

    def _forget_new_slot(self, slot: _Slot) -> None:
        """Undoes `_new_slot` for a slot the engine never took: off the
        table, and its death callback disarmed (a weak reference that dies
        first never calls back)."""
        if self._slots.get(slot.key) is slot:
            del self._slots[slot.key]
        slot.ref = None

    def _drain(self) -> None:
        """Hands dead storages to the engine (freed, or kept as history) and
        drops the records of calls the engine freed, which may free more."""
        engine = self._engine
        while True:
            while self._deaths:
                slot = self._deaths.pop()
                slot.resident = False
                if slot.unfilled:
                    slot.unfilled = False
                    self._unfilled -= 1
                if slot.only_history:
                    continue  # its handle was released then
                if self._slot_of_handle.get(slot.handle) is slot:
                    del self._slot_of_handle[slot.handle]
                engine.release(slot.handle)
            forgotten = engine.take_forgotten()
            if not forgotten:
                return
            for call_id in forgotten:
                call = self._calls.pop(call_id, None)
                if call is not None:
                    call.live = False
                    call.keep.clear()  # may kill storages: another round

    def _copy_of(self, slot: _Slot, op: str) -> _Slot:
        """A constant copy of shared `slot`'s bytes as they are now, for
        recorded calls to read: one per change of the bytes, compared byte
        for byte at every op that reads them. Copies live while a call that
        may re-run reads them."""
        storage = slot.storage()
        if slot.copy_storage is not None and _same_bytes(slot.copy_storage, storage):
            return slot.copy
        copy = storage.clone()
        copy_slot = self._new_slot(copy)
        self._adopt_new(copy_slot, op, "copying memory the host shares")
        slot.copy, slot.copy_storage = copy_slot, copy
        return copy_slot

    def _made_constant(self, slot: _Slot) -> None:
        """Marks a slot the engine detached: its readers now keep it alive."""
        slot.constant = True
        readers, slot.readers = slot.readers, None
        if readers:
            storage = slot.storage()
            for call in readers:
                if call.live and storage is not None:
                    call.keep.append(storage)

    def _detach(self, slot: _Slot, op: str, what: str) -> None:
        self._engine_call(self._engine.detach, op, what, slot.handle)
        self._made_constant(slot)

    def _preserve_dependents(self, slot: _Slot, op: str, what: str) -> None:
        """Before `slot` is written in place (a constant, or any storage
        under `no_grad`), what was computed from its old value must not be
        recomputed from the new one. When a copy of the old value takes fewer
        bytes than the nearest held tensors computed from it, the history
        reads the copy (a small running mean that a norm's output reads);
        otherwise those tensors are detached (a loss held while the
        optimiser writes the weights)."""
        engine = self._engine
        storage = slot.storage() if slot.resident else None
        # Copies still alive count too: writes to many small constants (the
        # biases, say) that the same held tensors were computed from copy
        # until detaching those would have cost less.
        if (storage is not None
                and (engine.bytes_preserving_dependents(slot.handle)
                     > self._history_copy_bytes + slot.nbytes)
                and self._copy_for_history(slot, storage)):
            return
        # The engine names each tensor it detaches (`made_constant`) as it
        # goes, so one detached before an out-of-memory error counts too.
        self._engine_call(engine.preserve_dependents, op, what, slot.handle)

    def _copy_for_history(self, slot: _Slot, storage: torch.UntypedStorage) -> bool:
        """Has every recorded call that reads `slot` read a constant copy of
        its bytes instead; False, changing nothing, when the copy finds no
        room. The engine holds the copy itself (its buffer is the storage) and
        drops it with the last call that reads it. The calls still keep the
        original storage alive (`_Call.keep`), as they did: a storage written
        in place is mostly long-lived state."""
        engine = self._engine
        copy = storage.clone()
        try:
            handle = engine.adopt(slot.nbytes, copy)
        except _native.OutOfMemoryError:
            return False
        try:
            engine.redirect_reads(slot.handle, handle)
            redirected = True
        except ValueError:  # an op reads a view of it: detaching instead
            redirected = False
        finally:
            engine.release(handle)  # history only, or freed if nothing reads it
        if redirected:
            self._history_copy_bytes += slot.nbytes
            weakref.finalize(copy, self._history_copy_freed, slot.nbytes)
        return redirected

    def _history_copy_freed(self, nbytes: int) -> None:
        self._history_copy_bytes -= nbytes

    def _host_access(self, tensor: _Tensor, access: str) -> Optional["_Slot"]:
        """The host reads `tensor`'s memory (`access` _READ), holds on to it
        (_KEEP) or writes it (_WRITE): a storage kept or written becomes a
        constant, and before a write so does every tensor computed from its
        value (as before an op's write to a constant), since a
        recomputation would read the new bytes.
        A read pins the storage until `_host_read_done`: the read itself may
        run ops (`copy.deepcopy` allocates its copy), which must not evict
        what it reads. Returns the slot so pinned. Tensors this session does
        not manage, and reads from threads that do not run the session's
        dispatch mode, are left be. Those that do are the thread that entered
        it and the threads PyTorch hands its modes to: on CUDA, autograd's
        device thread runs the backward pass."""
        if self._engine is None or self._busy or not isinstance(tensor, _Tensor):
            return None
        if self._mode not in _get_current_dispatch_mode_stack():
            return None
        if tensor.layout is not _STRIDED or tensor.device != self.device:
            return None
        try:
            key = _storage_of(tensor)._cdata
        except (RuntimeError, NotImplementedError):  # no storage: the method says so itself
            return None
        self._drain()
        slot = self._slots.get(key)
        if slot is None:
            return None
        with self._outside_dispatch(slot):
            if access is _WRITE:
                what = "preparing a write on the host"
                self._preserve_dependents(slot, "", what)
                if not slot.constant:
                    self._detach(slot, "", what)
                return None
            if access is _KEEP and not slot.constant:
                self._detach(slot, "", "handing a tensor's memory to the host")
                return None
            if slot.constant:
                return None  # never evicted
            self._engine_call(self._engine.pin, "", "reading a tensor on the host", slot.handle)
            return slot

    def _host_read_done(self, slot: "_Slot") -> None:
        """The host read that `_host_access` pinned `slot` for is over."""
        if self._engine is not None and self._slots.get(slot.key) is slot:
            self._engine.unpin(slot.handle)

    @staticmethod
    def _outside_dispatch(slot: _Slot):
        """Hooks and host reads run with the dispatch mode on, and
        rematerialising `slot` re-runs ops: they must not come back to it."""
        return contextlib.nullcontext() if slot.resident else _disable_current_modes()

    def _module(self) -> Optional[str]:
        """The innermost module running now (its path), when recording a trace."""
        if self._modules is None:
            return None
        parents = self._modules.parents
        if len(parents) <= 1:
            return None  # only "Global"
        return max(parents, key=lambda name: (name.count("."), name))

    def _engine_call(self, method, op: str, what: str, *args):
        """Calls the engine for ATen op `op`, raising `dtr.OutOfMemory` naming
        it; out of memory, tries once more after handing the engine the
        constants that only history keeps alive."""
        try:
            return method(*args)
        except _native.OutOfMemoryError as error:
            thrashing = error.args[1] == "recomputation"
            if thrashing or not self._hand_over_what_only_history_holds():
                raise self._out_of_memory(error, op, what) from None
        try:
            return method(*args)
        except _native.OutOfMemoryError as error:
            raise self._out_of_memory(error, op, what) from None

    def _hand_over_what_only_history_holds(self) -> bool:
        """Releases the handles of constants whose storage nothing but
        recorded calls (`_Call.keep`) holds: no tensor, no other Python
        reference. Stock PyTorch would have freed them (an index tensor an
        op made, a batch the program let go of); to the engine they are now
        history, which it frees when no eviction can make room by detaching
        the tensors computed from them (`dtr::Config::free_constants_by_detaching`).
        Returns whether there was any. Run only out of memory: it counts
        references across every live call."""
        keeps: Dict[int, int] = {}
        for call in self._calls.values():
            if call.live:
                for storage in call.keep:
                    keeps[id(storage)] = keeps.get(id(storage), 0) + 1
        handed = False
        for slot in list(self._slot_of_handle.values()):
            if not slot.constant:
                continue
            storage = slot.storage()
            kept = keeps.get(id(storage), 0) if storage is not None else 0
            # Python references: the calls', `storage` here, and getrefcount's own.
            if (kept == 0 or sys.getrefcount(storage) != kept + 2
                    or torch._C._storage_Use_Count(storage._cdata) != 1):
                continue
            slot.only_history = True
            del self._slot_of_handle[slot.handle]
            self._engine.release(slot.handle)
            handed = True
        return handed

    @staticmethod
    def _out_of_memory(error: Exception, op: str, what: str) -> OutOfMemory:
        message, context, requested, budget, in_use = error.args
        if context == "recomputation":  # thrashing: see _REMAT_RATIO_LIMIT
            return OutOfMemory(
                f"dtr: {op or 'an op'} made no progress within the budget while {what}: "
                f"{message} (over {_REMAT_RATIO_LIMIT:g}× the compute of every op's first "
                f"run). Raise the budget and retry.",
                op=op, requested_bytes=requested, budget_bytes=budget, in_use_bytes=in_use,
            )
        return OutOfMemory(
            f"dtr: {op or 'an op'} ran out of memory while {what}: {message}. "
            f"Raise the budget (at least {in_use + requested} bytes are needed here) "
            f"and retry.",
            op=op, requested_bytes=requested, budget_bytes=budget, in_use_bytes=in_use,
        )

    # ----- the engine's host protocol ----------------------------------------

    def execute(self, call_id: int, buffers: list) -> list:
        """Re-runs recorded call ``call_id`` over the engine's input buffers."""
        start = _perf_ns()
        call = self._calls.get(call_id)
        if call is None:
            raise RuntimeError(f"dtr: no record of call {call_id} to recompute")
        storages = []
        for buffer in buffers:
            if type(buffer) is _Buf:
                storage = buffer.slot.storage() if buffer.owns else None
                if storage is None:
                    raise RuntimeError("dtr: a storage the engine holds as resident is gone")
                storages.append(storage)
            else:
                storages.append(buffer)
        for index in call.copied_inputs:
            storages[index] = storages[index].clone()
        for index in call.scratch_inputs:
            storages[index] = storages[index].clone()
        args = _rebuild(call.args, storages)
        kwargs = {name: _rebuild(value, storages) for name, value in call.kwargs.items()}
        with _settings.restored(call.settings):
            if call.rng is None:
                result = call.func(*args, **kwargs)
            else:
                generator, state = call.rng
                now = generator.get_state()
                generator.set_state(state)
                try:
                    result = call.func(*args, **kwargs)
                finally:
                    generator.set_state(now)
        flat = _flatten(result, [])
        outputs = []
        for source, slot, handle in zip(call.sources, call.slots, call.handles):
            fresh = _storage_of(flat[source]) if source >= 0 else storages[-1 - source]
            # Only an evicted current version takes the data back; for history,
            # or an output still resident (which the engine discards), the
            # fresh storage itself is the buffer.
            current = slot.handle == handle and slot.buf.owns and not slot.resident
            target = slot.storage() if current else None
            if target is None:
                outputs.append(fresh)
                continue
            if fresh.nbytes() != slot.nbytes:
                raise RuntimeError(
                    f"dtr: recomputing {call.func} made {fresh.nbytes()} bytes where its "
                    f"first run made {slot.nbytes}")
            if _SWAPS_DATA_PTR and target.nbytes() == 0 and fresh.nbytes() == slot.nbytes:
                target._swap_data_ptr_(fresh)
            else:
                target.resize_(fresh.nbytes())
                target.copy_(fresh)
            slot.resident = True
            outputs.append(slot.buf)
        self._remat_ns += _perf_ns() - start
        return outputs

    def made_constant(self, handle: int) -> None:
        """The engine detached a tensor it chose: one computed from a
        constant about to be written, or one whose history kept the last of
        a constant (see `dtr::Config::free_constants_by_detaching`)."""
        slot = self._slot_of_handle.get(handle)
        if slot is not None:
            self._made_constant(slot)

    def release(self, buffer) -> None:
        """Frees one buffer: a current storage shrinks to zero bytes."""
        if type(buffer) is _Buf and buffer.owns:
            slot = buffer.slot
            slot.resident = False
            storage = slot.storage()
            if storage is not None:
                storage.resize_(0)

    # ----- one op ----------------------------------------------------------

    def _input(self, tensor: _Tensor, inputs: List[_Slot], index_of: Dict[int, int],
               op: str) -> Any:
        """Tracks a tensor argument as an input; its template when recording."""
        slot = self._track(tensor, op)
        if slot is None:
            for part in self._parts_of(tensor, op):
                if part.key not in index_of:
                    index_of[part.key] = len(inputs)
                    inputs.append(part)
            return tensor
        index = index_of.get(slot.key)
        if index is None:
            index = index_of[slot.key] = len(inputs)
            inputs.append(slot)
        return _Arg(index, tensor) if self._recording else tensor

    def _inputs(self, values, inputs: List[_Slot], index_of: Dict[int, int], op: str) -> list:
        """Tracks the tensors among `values` (and in lists among them, as
        ATen takes them) as inputs; returns the values as templates."""
        templates = []
        for value in values:
            if isinstance(value, _Tensor):
                value = self._input(value, inputs, index_of, op)
            elif type(value) in _SEQUENCES:
                value = type(value)(
                    self._input(item, inputs, index_of, op) if isinstance(item, _Tensor) else item
                    for item in value)
            templates.append(value)
        return templates

    def _dispatch(self, func, args: tuple, kwargs: dict):
        engine = self._engine
        self._drain()
        self._ops += 1
        info = _INFO.get(func) or op_info(func)

        inputs: List[_Slot] = []
        index_of: Dict[int, int] = {}
        template_args = self._inputs(args, inputs, index_of, info.name)
        template_kwargs = (dict(zip(kwargs, self._inputs(kwargs.values(), inputs, index_of,
                                                         info.name)))
                           if kwargs else kwargs)

        if self._unfilled:
            self._reading_unfilled(info, args, kwargs, inputs)

        # Writes, decided before running: making a constant may recompute.
        versioned: List[_Slot] = []
        constants_written: List[_Slot] = []
        if info.writes or info.hidden_writes:
            for written in info.written(args, kwargs):
                for tensor in _flatten(written, []):
                    if not isinstance(tensor, _Tensor):
                        continue
                    slot = self._track(tensor, info.name)
                    # A sparse, nested or quantized tensor writes its parts
                    # (constants all).
                    for slot in ((slot,) if slot is not None
                                 else self._parts_of(tensor, info.name)):
                        if slot in versioned or slot in constants_written:
                            continue
                        if slot.constant or not torch.is_grad_enabled():
                            what = "preparing its in-place write"
                            self._preserve_dependents(slot, info.name, what)
                            if not slot.constant:
                                self._detach(slot, info.name, what)
                            constants_written.append(slot)
                        else:
                            versioned.append(slot)

        pinned: Optional[List[int]] = None
        # Every op needs its inputs resident, views too: they check the
        # storage's size.
        if not all([slot.resident for slot in inputs]):
            pinned = []
            try:
                for slot in inputs:
                    self._engine_call(engine.pin, info.name, "recomputing its inputs",
                                      slot.handle)
                    pinned.append(slot.handle)
            except BaseException:
                self._unpin(pinned)
                raise
        # Old versions of storages written in place: released only once
        # unpinned (a pin of a released tensor could never be undone).
        retired: List[int] = []
        raised: List[bool] = []  # set when the op itself raised
        try:
            return self._run(func, info, args, kwargs, template_args, template_kwargs,
                             inputs, versioned, constants_written, retired, raised)
        except BaseException:
            if pinned is not None:
                self._unpin(pinned)
                pinned = None
            # A session without a budget records no calls to recompute from:
            # it keeps whatever the op left, as stock PyTorch does.
            if self._recording:
                for slot in versioned:
                    if raised:
                        # Stock PyTorch keeps what a failing op wrote in
                        # place before it raised (`index_put_` stops at the
                        # first index out of bounds).
                        self._keep_as_written(slot, info.name)
                    elif slot.resident and slot.buf.owns:
                        # It ran but could not be recorded (no room for its
                        # outputs): the engine still has the old version, so
                        # the written data goes; the next use recomputes the
                        # value from before the op, where a retry under a
                        # larger budget starts.
                        engine.evict(slot.handle)
            raise
        finally:
            if pinned is not None:
                self._unpin(pinned)
            for handle in retired:
                engine.release(handle)

    def _reading_unfilled(self, info, args: tuple, kwargs: dict, inputs: List[_Slot]) -> None:
        """An op reads storages that `empty` made and no op has written
        since: C++ code filled them with no op the session saw (or nothing
        did, and the op reads garbage, as stock PyTorch does). A re-run of
        `empty` would not give those bytes back, so each becomes a constant
        first. An op that overwrites one without reading it (`fill_`, an
        `out=` argument) makes a new version it can recompute; a view op
        reads no values."""
        if info.view:
            return
        overwritten = ()
        if info.overwrites:
            overwritten = [_storage_of(tensor)._cdata
                           for tensor in _flatten(info.overwritten(args, kwargs), [])
                           if isinstance(tensor, _Tensor) and tensor.layout is _STRIDED]
        for slot in inputs:
            if not slot.unfilled:
                continue
            slot.unfilled = False
            self._unfilled -= 1
            if slot.key not in overwritten and not slot.constant:
                self._detach(slot, info.name, "keeping bytes no op wrote")

    def _unpin(self, handles: List[int]) -> None:
        for handle in handles:
            self._engine.unpin(handle)

    def _run(self, func, info, args, kwargs, template_args, template_kwargs,
             inputs, versioned, constants_written, retired, raised):
        engine = self._engine
        rng = None
        if info.seeded and self._recording:
            generator = _generator(args, kwargs)
            rng = (generator, generator.get_state())
        start = _perf_ns()
        try:
            result = func(*args, **kwargs)
        except BaseException:
            raised.append(True)
            raise
        cost = _perf_ns() - start
        # `resize_`, `set_` and `out=` arguments can change the size of a
        # storage written in place: the engine counts it at its new size.
        for slot in constants_written:
            storage = slot.storage()
            if storage is not None and storage.nbytes() != slot.nbytes:
                retired.append(self._readopt(slot, storage.nbytes(), info.name))

        fresh: List[_Slot] = []
        sources: List[int] = []
        flat = [result] if type(result) is _Tensor else _flatten(result, [])
        slots = self._slots
        for position, value in enumerate(flat):
            if (not isinstance(value, _Tensor) or value.layout is not _STRIDED
                    or value.is_nested or value.is_quantized):
                continue
            if value.device != self.device:
                if self.device is not None or value.device.type == "meta":
                    continue
                self.device = value.device  # a factory op is the first to run
            storage = _storage_of(value)
            if storage._cdata in slots or storage.nbytes() == 0 or _holds_no_memory(storage):
                continue  # a view of an input, an in-place result, empty, or a wrapper
            if not storage.resizable():
                # Memory PyTorch did not allocate and cannot free (a mapped
                # file: `torch.from_file`): a constant, as a tensor made
                # outside the budget is, read through copies.
                self._track(value, info.name)
                continue
            fresh.append(self._new_slot(storage))
            sources.append(position)
        if not fresh and not versioned:
            if self._trace_path is not None and (constants_written or not any(
                    isinstance(value, _Tensor) for value in flat)):
                # The op read its inputs' values (to the host, or into a
                # constant): a trace marks such reads.
                for slot in inputs:
                    engine.ensure_resident(slot.handle)
            return result

        # Outputs a re-run could not reproduce are constants. Those of
        # grad-free ops stay recomputable (an evaluation loop's
        # activations): a write to what they were computed from, such as an
        # optimiser's step, first makes them constants.
        recomputable = not (info.nondeterministic and self.device.type == "cuda")
        if constants_written and not info.side_effect_only_writes:
            recomputable = False
        if recomputable and self._recording:
            # A re-run reads what shared memory held when the op ran.
            try:
                for index, slot in enumerate(inputs):
                    if slot.shared and slot not in constants_written:
                        inputs[index] = self._copy_of(slot, info.name)
            except BaseException:
                for slot in fresh:  # never tracked: the caller gets no result
                    self._forget_new_slot(slot)
                raise

        if versioned:
            new_versions = [_Buf(slot) for slot in versioned]
            sources.extend(-1 - inputs.index(slot) for slot in versioned)
            outputs = fresh + versioned
            buffers = [slot.buf for slot in fresh] + new_versions
        else:
            outputs = fresh
            buffers = [slot.buf for slot in fresh]
        call_id = self._next_call
        self._next_call += 1
        # A new version has the storage's size after the op (`resize_`, and
        # `out=` arguments the kernel grew, change it).
        sizes = [slot.nbytes for slot in fresh]
        if versioned:
            for slot in versioned:
                storage = slot.storage()
                sizes.append(storage.nbytes() if storage is not None else slot.nbytes)
        # Timings of small ops are mostly noise (a cache miss, a page fault,
        # the first call's warm-up), and h_DTR's choices flipped with it
        # from run to run: an op is charged the least time measured for the
        # same op on the same sizes.
        signature = (info.name, *sizes, *[slot.nbytes for slot in inputs])
        least = self._least_costs.get(signature)
        if least is None or cost < least:
            self._least_costs[signature] = cost
        else:
            cost = least
        try:
            handles = self._engine_call(
                engine.apply, info.name, "making room for its outputs",
                call_id, info.name, [slot.handle for slot in inputs], buffers,
                sizes, cost,
                self._module() if self._modules is not None else None,
            )
        except BaseException:
            for slot in fresh:  # never tracked: the caller gets no result
                self._forget_new_slot(slot)
            raise
        slot_of_handle = self._slot_of_handle
        for slot, handle in zip(fresh, handles):
            slot.handle = handle
            slot_of_handle[handle] = slot
        if versioned:
            for slot, buf, handle, nbytes in zip(versioned, new_versions, handles[len(fresh):],
                                                 sizes[len(fresh):]):
                slot.buf.owns = False  # the old version's value is overwritten
                slot.buf = buf
                slot.nbytes = nbytes
                old, slot.handle = slot.handle, handle
                del slot_of_handle[old]
                slot_of_handle[handle] = slot
                retired.append(old)

        if not recomputable:
            for slot in outputs:
                self._detach(slot, info.name, "keeping its outputs")
            return result
        if self._recording:
            for slot, position in zip(fresh, sources):
                value = flat[position]
                if _is_index(value) and (slot.nbytes <= _INDEX_BYTES or _is_position_list(value)):
                    self._detach(slot, info.name, "keeping an index tensor")
            call = _Call(
                func, template_args, template_kwargs, sources, outputs,
                copied_inputs=tuple(inputs.index(slot) for slot in versioned),
                scratch_inputs=tuple(inputs.index(slot) for slot in constants_written),
                rng=rng,
            )
            call.handles = handles
            if info.uninitialized:
                for slot in fresh:
                    slot.unfilled = True
                    self._unfilled += 1
            for slot in inputs:
                if slot.constant:
                    call.keep.append(slot.storage())
                else:
                    slot.readers.append(call)
            self._calls[call_id] = call
        return result
