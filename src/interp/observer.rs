//! Watching the program an interpreter runs (for recording traces).

use crate::graph::TensorId;
use crate::ops::{Op, Signature};

/// An instruction on one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorInstruction {
    Retain,
    Del,
    Get,
    Pin,
    Unpin,
    Detach,
}

/// Sees every instruction the user's program gives, after it succeeded.
pub trait ProgramObserver: Send {
    fn put(&mut self, tensor: TensorId, bytes: u64, dims: &[usize], data: Option<&[f32]>);
    fn apply(&mut self, op: &Op, inputs: &[TensorId], outputs: &[TensorId], signature: &Signature);
    fn instruction(&mut self, instruction: TensorInstruction, tensor: TensorId);
    /// The program is over: flush, and report any error met on the way.
    fn finish(&mut self) -> std::io::Result<()>;
}
