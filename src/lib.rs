//! # dtr — Dynamic Tensor Rematerialization
//!
//! An eager tensor runtime that keeps memory under a budget by evicting
//! tensors and recomputing them, transparently, when they are needed again
//! (Kirisame et al., ICLR 2021).
//!
//! Layers, low to high: [`shape`] and [`ops`] describe tensors and ops;
//! [`backend`] executes them; [`graph`] holds the tensors' compute
//! history; [`policy`] chooses what to evict; [`memory`] accounts bytes;
//! [`interp`] runs `put / apply_op / del / get_value` on top of them.

#![warn(missing_docs)]

pub mod backend;
pub mod config;
pub mod eager;
pub mod error;
pub mod experiments;
pub mod graph;
pub mod intern;
pub mod interp;
pub mod memory;
pub mod ops;
pub mod policy;
pub mod shape;
pub mod trace;

pub use backend::cpu::CpuBackend;
pub use backend::simulator::SimulatorBackend;
#[cfg(feature = "wgpu")]
pub use backend::wgpu::{WgpuBackend, WgpuOptions};
pub use backend::{Backend, BufferView};
pub use config::{parse_bytes, Budget, Config, RestoreMode, SwapConfig};
pub use error::{Error, Result};
pub use graph::TensorId;
pub use interp::{
    BlockMove, Event, Interpreter, MemoryReport, Observer, PlanRecord, Reservation, RunEvent, Stats,
};
pub use ops::{BinaryOp, Op, ReduceOp, ScalarOp, UnaryOp, Window2d};

// The README's Rust snippets compile and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
