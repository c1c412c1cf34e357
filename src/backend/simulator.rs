//! A backend that carries no data: buffers are sizes only, ops cost nothing
//! to run. Replays on it exercise the real interpreter and policy code (the
//! same decisions as a data backend) at the speed of bookkeeping.

use smallvec::SmallVec;

use super::{Backend, BufferView};
use crate::error::{Error, Result};
use crate::ops::{Op, Signature};
use crate::shape::Layout;

#[derive(Debug, Default, Clone)]
pub struct SimulatorBackend;

impl SimulatorBackend {
    pub fn new() -> SimulatorBackend {
        SimulatorBackend
    }
}

impl Backend for SimulatorBackend {
    type Buffer = ();

    fn name(&self) -> &'static str {
        "simulator"
    }

    fn upload(&mut self, _data: &[f32], _layout: &Layout) -> Result<()> {
        Ok(())
    }

    fn allocate(&mut self, _layout: &Layout, _bytes: u64) -> Result<()> {
        Ok(())
    }

    fn execute(
        &mut self,
        _op: &Op,
        _inputs: &[BufferView<'_, ()>],
        signature: &Signature,
    ) -> Result<SmallVec<[Option<()>; 2]>> {
        Ok(signature
            .outputs
            .iter()
            .map(|o| o.alias_of.is_none().then_some(()))
            .collect())
    }

    fn read(&mut self, _view: BufferView<'_, ()>) -> Result<Vec<f32>> {
        Err(Error::backend(
            "simulator",
            "the simulator carries no data to read",
        ))
    }
}
