//! The session: one interpreter, shared by every tensor made in it.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use rand::rngs::StdRng;
use rand::SeedableRng;

use super::tensor::{Param, Tensor};
use crate::backend::Backend;
use crate::config::Config;
use crate::error::Result;
use crate::graph::TensorId;
use crate::interp::{Interpreter, MemoryReport, Stats};
use crate::ops::Op;

pub(crate) struct Shared<B: Backend> {
    pub(crate) interpreter: RefCell<Interpreter<B>>,
    /// While set, ops record no backward (optimiser updates, the backward pass).
    pub(crate) no_grad: Cell<bool>,
    /// Handles dropped while the interpreter was borrowed, released at the next op.
    pending_dels: RefCell<Vec<TensorId>>,
}

/// An interpreter with its backend and config, shared by the tensors made
/// in it. Cloning gives another handle to the same session.
pub struct Session<B: Backend> {
    pub(crate) shared: Rc<Shared<B>>,
}

impl<B: Backend> Clone for Session<B> {
    fn clone(&self) -> Self {
        Session {
            shared: self.shared.clone(),
        }
    }
}

impl<B: Backend> Session<B> {
    /// A session running on `backend` under `config` (its budget, heuristic, memory model).
    pub fn new(backend: B, config: Config) -> Result<Session<B>> {
        Ok(Session {
            shared: Rc::new(Shared {
                interpreter: RefCell::new(Interpreter::new(backend, config)?),
                no_grad: Cell::new(false),
                pending_dels: RefCell::new(Vec::new()),
            }),
        })
    }

    /// A seeded generator for initialising parameters and data.
    pub fn rng(&self, seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    /// Runs `f` on the interpreter (for what the tensor API does not cover:
    /// pins, observers, events).
    pub fn with_interpreter<R>(&self, f: impl FnOnce(&mut Interpreter<B>) -> R) -> R {
        let result = f(&mut self.shared.interpreter.borrow_mut());
        self.release_pending();
        result
    }

    /// A constant tensor from data (row-major).
    pub fn tensor(&self, data: &[f32], dims: &[usize]) -> Result<Tensor<B>> {
        let id = self.with_interpreter(|dtr| dtr.put(data, dims))?;
        Ok(Tensor::wrap(self, id, None))
    }

    /// A tensor of `dims` filled with `value` (recomputable: costs no put).
    pub fn full(&self, dims: &[usize], value: f32) -> Result<Tensor<B>> {
        let id = self.with_interpreter(|dtr| dtr.apply1(Op::fill(dims, value), &[]))?;
        Ok(Tensor::wrap(self, id, None))
    }

    /// A trainable parameter initialised from data.
    pub fn param(&self, data: &[f32], dims: &[usize]) -> Result<Param<B>> {
        Param::new(self, data, dims)
    }

    /// Runs `f` without recording backward ops.
    pub fn no_grad<R>(&self, f: impl FnOnce() -> R) -> R {
        let before = self.shared.no_grad.replace(true);
        let result = f();
        self.shared.no_grad.set(before);
        result
    }

    /// Bytes in use, the peak and the budget now (see [`Interpreter::memory`]).
    pub fn memory(&self) -> MemoryReport {
        self.shared.interpreter.borrow().memory()
    }

    /// The interpreter's counters so far: compute, evictions, rematerialisations.
    pub fn stats(&self) -> Stats {
        self.shared.interpreter.borrow().stats().clone()
    }

    /// Marks the end of a training step: while the program repeats it, the
    /// next steps make this step's evictions by plan, with no policy (see
    /// [`Interpreter::mark_step`]). The first call starts recording.
    pub fn mark_step(&self) -> Result<()> {
        self.with_interpreter(|dtr| dtr.mark_step())
    }

    /// Changes the budget (`None`: unbounded).
    pub fn set_budget_bytes(&self, budget: Option<u64>) {
        self.with_interpreter(|dtr| dtr.set_budget_bytes(budget));
    }

    /// Drops one interpreter handle (called by the last clone of a tensor).
    pub(crate) fn release(&self, id: TensorId) {
        match self.shared.interpreter.try_borrow_mut() {
            Ok(mut dtr) => {
                // A handle the session made is live and no op is running
                // between calls, so this cannot fail; say so if it ever does.
                if let Err(error) = dtr.del(id) {
                    tracing::warn!(target: "dtr::eager", %error, "releasing a tensor handle");
                }
            }
            Err(_) => self.shared.pending_dels.borrow_mut().push(id),
        }
    }

    fn release_pending(&self) {
        let pending: Vec<TensorId> = self.shared.pending_dels.borrow_mut().drain(..).collect();
        for id in pending {
            self.release(id);
        }
    }
}
