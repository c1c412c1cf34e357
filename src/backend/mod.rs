//! Backends execute ops on buffers; the interpreter decides what lives where.
//!
//! A backend never sees tensor ids, budgets or eviction: it uploads, runs an
//! op over input views and returns fresh buffers, and reads a view back.
//! Dropping (or [`Backend::release`]-ing) a buffer frees its memory.

pub mod cpu;
pub mod simulator;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use smallvec::SmallVec;

use crate::error::Result;
use crate::graph::TensorId;
use crate::memory::Block;
use crate::ops::{Op, Signature};
use crate::shape::Layout;

/// A tensor as a backend sees it: a buffer and a layout inside it.
#[derive(Debug)]
pub struct BufferView<'a, B> {
    /// The storage's memory.
    pub buffer: &'a B,
    /// Where the tensor's elements are in it.
    pub layout: &'a Layout,
}

// Manual impls: a view is two references, copyable whatever `B` is.
impl<B> Clone for BufferView<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for BufferView<'_, B> {}

/// Where ops run and tensors live.
pub trait Backend: 'static {
    /// The memory behind one storage.
    type Buffer;

    /// A short name for messages (`"cpu"`, `"wgpu"`).
    fn name(&self) -> &'static str;

    /// Copies host data (row-major, `layout.numel()` values) into a new
    /// buffer. `at` is its place in the arena when memory is an arena
    /// (backends that own one address space put it there; others ignore it).
    fn upload(&mut self, data: &[f32], layout: &Layout, at: Option<Block>) -> Result<Self::Buffer>;

    /// A new buffer of `bytes` for a tensor whose values are not known (a
    /// constant in a data-free trace). Data backends fill it with zeros.
    fn allocate(&mut self, layout: &Layout, bytes: u64, at: Option<Block>) -> Result<Self::Buffer>;

    /// Runs `op` over `inputs`. Returns, in output order, a fresh buffer for
    /// every output that is not a view (`signature.outputs[i].alias_of` is
    /// `None`) and `None` for views, which share their input's buffer. `at`
    /// gives the fresh outputs' arena places, in order, in arena memory.
    fn execute(
        &mut self,
        op: &Op,
        inputs: &[BufferView<'_, Self::Buffer>],
        signature: &Signature,
        at: Option<&[Block]>,
    ) -> Result<SmallVec<[Option<Self::Buffer>; 2]>>;

    /// Reads a view back to the host, row-major.
    fn read(&mut self, view: BufferView<'_, Self::Buffer>) -> Result<Vec<f32>>;

    /// Gives a buffer's memory back. The default drops it.
    fn release(&mut self, buffer: Self::Buffer) {
        drop(buffer);
    }

    /// The interpreter will never run `op` again (its node was freed): a
    /// backend that keeps per-op records (a foreign framework's recorded
    /// calls) may drop them. The default does nothing.
    fn forget(&mut self, op: &Op) {
        let _ = op;
    }

    /// The interpreter detached `tensor`, a tensor the host did not name:
    /// one computed from a constant about to be written
    /// ([`Interpreter::preserve_dependents`](crate::Interpreter::preserve_dependents)),
    /// or one whose history held the last of a constant (see
    /// [`Config::free_constants_by_detaching`](crate::Config::free_constants_by_detaching)).
    /// A backend whose host keeps constants' buffers alive for the ops
    /// that read them must now do so for this one, at once: the host may
    /// drop its last reference before the interpreter returns. The default
    /// does nothing.
    fn made_constant(&mut self, tensor: TensorId) {
        let _ = tensor;
    }

    /// Whether [`Backend::read`] and [`Backend::upload`] can move a storage's
    /// whole buffer to host memory and back bit for bit, so the interpreter
    /// can swap evicted storages instead of recomputing them. Backends whose
    /// buffers the host cannot read (a foreign framework's) say no.
    fn can_swap(&self) -> bool {
        false
    }

    /// How much memory the device has in all, when the backend can tell: the
    /// base of a budget given as a fraction of device memory.
    fn device_memory_bytes(&self) -> Option<u64> {
        None
    }
}
