//! Static √N checkpointing (Chen et al., "Training Deep Nets with Sublinear
//! Memory Cost", 2016) applied to a trace: what a user would pick instead
//! of DTR. It is planned once, before the run, from the unbounded run:
//!
//! - The tensors *saved for the backward pass* are the op outputs alive at
//!   the unbounded peak (where a training step turns from forward to
//!   backward). Taken in the order they were made, they are cut greedily
//!   into segments of about `total bytes / √n` (Chen et al.'s Algorithm 3,
//!   which gives √n segments of √n tensors on a uniform chain); the last
//!   tensor of each segment is a checkpoint and stays in memory.
//! - Every other saved tensor is evicted right after its last use before
//!   the peak, and recomputed from the checkpoints when the backward pass
//!   reads it; what was recomputed stays until the program releases it, so
//!   each segment is recomputed once, as in Chen et al. Recomputed tensors
//!   the program had already released (kept only as history) are evicted
//!   again once the event that needed them is over.
//!
//! The run has no budget: static checkpointing has one memory footprint,
//! its peak, which is reported as its ratio. A trace of several steps is
//! planned around the step holding the peak, as Chen et al. plan one step.

use std::collections::HashMap;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::interp::{Event, Interpreter};
use crate::trace::replay::{replay_observed, Kernels, ReplayReport};
use crate::trace::{Trace, TraceEvent, TraceTensor};
use crate::{Config, SimulatorBackend};

/// Which tensors to evict after which trace event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// The trace event after which the unbounded run peaks.
    pub peak_event: usize,
    /// Tensors saved for the backward pass.
    pub saved: usize,
    /// Saved tensors kept in memory.
    pub checkpoints: usize,
    /// Trace event index → the tensors to evict once it has run.
    evict_after: HashMap<usize, Vec<TraceTensor>>,
}

impl CheckpointPlan {
    /// Plans √N checkpointing for `trace` (runs it once, unbounded, on the simulator).
    pub fn new(trace: &Trace) -> Result<CheckpointPlan> {
        let mut dtr = Interpreter::new(SimulatorBackend::new(), Config::default())?;
        // The first event after which memory in use is highest.
        let (mut peak_bytes, mut peak_event) = (0, 0);
        replay_observed(trace, &mut dtr, Kernels::Recorded, |event, dtr, _| {
            let in_use = dtr.memory().in_use_bytes;
            if in_use > peak_bytes {
                (peak_bytes, peak_event) = (in_use, event);
            }
            Ok(())
        })?;
        Ok(CheckpointPlan::around(trace, peak_event))
    }

    /// Plans with the forward pass ending at trace event `peak_event`.
    pub fn around(trace: &Trace, peak_event: usize) -> CheckpointPlan {
        let count = trace.tensor_count();
        // For each tensor: made by an op (not a view), when; its last read
        // up to the peak; when its last handle was released.
        let mut made_at: Vec<Option<usize>> = vec![None; count];
        let mut last_read = vec![0usize; count];
        let mut handles = vec![0u32; count];
        let mut released_at: Vec<Option<usize>> = vec![None; count];
        for (index, event) in trace.events.iter().enumerate() {
            match event {
                TraceEvent::Put { tensor, .. } => handles[*tensor as usize] = 1,
                TraceEvent::Apply(apply) => {
                    let (inputs, outputs) = (&apply.inputs, &apply.outputs);
                    if index <= peak_event {
                        for &input in inputs {
                            last_read[input as usize] = index;
                        }
                    }
                    for output in outputs {
                        let t = output.tensor as usize;
                        handles[t] = 1;
                        if output.alias_of.is_none() && output.bytes > 0 {
                            made_at[t] = Some(index);
                            last_read[t] = last_read[t].max(index);
                        }
                    }
                }
                TraceEvent::Get { tensor } if index <= peak_event => {
                    last_read[*tensor as usize] = index;
                }
                TraceEvent::Retain { tensor } => handles[*tensor as usize] += 1,
                TraceEvent::Del { tensor } => {
                    let t = *tensor as usize;
                    handles[t] = handles[t].saturating_sub(1);
                    if handles[t] == 0 {
                        released_at[t] = Some(index);
                    }
                }
                _ => {}
            }
        }
        let mut saved: Vec<(usize, TraceTensor)> = (0..count)
            .filter_map(|t| {
                let made = made_at[t]?;
                let alive_at_peak =
                    made <= peak_event && released_at[t].is_none_or(|r| r > peak_event);
                alive_at_peak.then_some((made, t as TraceTensor))
            })
            .collect();
        saved.sort_unstable();
        let total: u64 = saved
            .iter()
            .map(|&(_, t)| trace.storage_bytes[t as usize])
            .sum();
        let segment_bytes = total as f64 / (saved.len().max(1) as f64).sqrt();
        let mut plan = CheckpointPlan {
            peak_event,
            saved: saved.len(),
            ..CheckpointPlan::default()
        };
        let mut filled = 0.0;
        for &(_, tensor) in &saved {
            filled += trace.storage_bytes[tensor as usize] as f64;
            if filled >= segment_bytes {
                filled = 0.0;
                plan.checkpoints += 1;
            } else {
                plan.evict_after
                    .entry(last_read[tensor as usize])
                    .or_default()
                    .push(tensor);
            }
        }
        plan
    }

    /// Runs `trace` on `dtr` following the plan. `dtr` should have no budget
    /// and must record events ([`Config::with_events`]).
    pub fn run<B: Backend>(
        &self,
        trace: &Trace,
        dtr: &mut Interpreter<B>,
        kernels: Kernels,
    ) -> Result<ReplayReport> {
        if !dtr.config().record_events {
            return Err(Error::InvalidArgument(
                "static checkpointing needs an interpreter that records events".into(),
            ));
        }
        let mut seen_events = dtr.events().len();
        replay_observed(trace, dtr, kernels, |index, dtr, tensors| {
            for &tensor in self.evict_after.get(&index).into_iter().flatten() {
                if let Some(id) = tensors[tensor as usize] {
                    dtr.evict_now(id)?;
                }
            }
            let remade: Vec<_> = dtr.events()[seen_events..]
                .iter()
                .filter_map(|event| match event {
                    Event::Rematerialize { tensor, .. } => Some(*tensor),
                    Event::Evict { .. } => None,
                })
                .collect();
            for tensor in remade {
                let graph = dtr.graph();
                let released = graph.tensors.get(tensor).is_some_and(|info| {
                    graph.storages[info.storage]
                        .tensors
                        .iter()
                        .all(|&t| graph.tensors[t].user_refs == 0)
                });
                if released {
                    dtr.evict_now(tensor)?;
                }
            }
            seen_events = dtr.events().len();
            Ok(())
        })
    }
}
