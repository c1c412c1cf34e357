//! A backend that carries no data: buffers are sizes only, ops cost nothing
//! to run. Replays on it exercise the real interpreter and policy code (the
//! same decisions as a data backend) at the speed of bookkeeping.

use smallvec::SmallVec;

use super::{Backend, BufferView};
use crate::error::Result;
use crate::memory::Block;
use crate::ops::{Op, Signature};
use crate::shape::Layout;

/// Runs nothing: buffers are `()`, reads return no values, and only the
/// interpreter's bookkeeping (sizes, costs, evictions) happens.
#[derive(Debug, Default, Clone)]
pub struct SimulatorBackend;

impl SimulatorBackend {
    /// The simulator (it has no state).
    pub fn new() -> SimulatorBackend {
        SimulatorBackend
    }
}

impl Backend for SimulatorBackend {
    type Buffer = ();

    fn name(&self) -> &'static str {
        "simulator"
    }

    fn can_swap(&self) -> bool {
        true
    }

    fn upload(&mut self, _data: &[f32], _layout: &Layout, _at: Option<Block>) -> Result<()> {
        Ok(())
    }

    fn allocate(&mut self, _layout: &Layout, _bytes: u64, _at: Option<Block>) -> Result<()> {
        Ok(())
    }

    fn execute(
        &mut self,
        _op: &Op,
        _inputs: &[BufferView<'_, ()>],
        signature: &Signature,
        _at: Option<&[Block]>,
    ) -> Result<SmallVec<[Option<()>; 2]>> {
        Ok(signature
            .outputs
            .iter()
            .map(|o| o.alias_of.is_none().then_some(()))
            .collect())
    }

    /// Reads return no values: there are none. (Succeeding keeps a replay's
    /// calls, and so its decisions, the same as on a data backend.)
    fn read(&mut self, _view: BufferView<'_, ()>) -> Result<Vec<f32>> {
        Ok(Vec::new())
    }
}
