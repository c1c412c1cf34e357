//! Running a trace on an interpreter, and the unbounded baseline it is
//! measured against.

use std::sync::Arc;
use std::time::Instant;

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::TensorId;
use crate::intern::Interner;
use crate::interp::{Interpreter, Stats};
use crate::ops::{Op, RecordedOp, RecordedOutput};

use super::{Trace, TraceEvent, TraceOutput, TraceTensor};

/// How ops are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// Only the recorded sizes and costs (for the simulator backend).
    Recorded,
    /// Each op's kernel, with its recorded cost (for data backends).
    Execute,
}

/// How a replay ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ReplayStatus {
    /// The trace ran to its end.
    #[serde(rename = "ok")]
    Ok,
    /// No eviction could make room: stopped there.
    #[serde(rename = "oom")]
    OutOfMemory,
    /// Rematerialisation passed the limit: stopped there.
    #[serde(rename = "thrash")]
    Thrash,
}

impl std::fmt::Display for ReplayStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ReplayStatus {
    /// `ok`, `oom` or `thrash`, as results files write it.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayStatus::Ok => "ok",
            ReplayStatus::OutOfMemory => "oom",
            ReplayStatus::Thrash => "thrash",
        }
    }
}

/// What a replay did.
#[derive(Debug, Clone)]
pub struct ReplayReport {
    /// Whether the replay ran to the end or stopped.
    pub status: ReplayStatus,
    /// The error that stopped an unfinished replay.
    pub message: Option<String>,
    /// The interpreter's counters at the end.
    pub stats: Stats,
    /// The most bytes in use at once.
    pub peak_bytes: u64,
    /// Values read by `get` events, in order (empty on the simulator).
    pub reads: Vec<(TraceTensor, Vec<f32>)>,
    /// Wall-clock time of the replay, in seconds.
    pub wall_seconds: f64,
}

/// Runs `trace` on `dtr`. Out-of-memory and thrashing end the replay with a
/// report saying so; other errors (bad kernels, backend failures) are
/// returned as `file:line` errors.
pub fn replay<B: Backend>(
    trace: &Trace,
    dtr: &mut Interpreter<B>,
    kernels: Kernels,
) -> Result<ReplayReport> {
    replay_observed(trace, dtr, kernels, |_, _, _| Ok(()))
}

/// [`replay`], calling `after_event(index, dtr, tensors)` once each trace
/// event has run, with the interpreter's tensor for each trace tensor made
/// so far (for timelines, and for schedules that act between events).
pub fn replay_observed<B: Backend>(
    trace: &Trace,
    dtr: &mut Interpreter<B>,
    kernels: Kernels,
    mut after_event: impl FnMut(usize, &mut Interpreter<B>, &[Option<TensorId>]) -> Result<()>,
) -> Result<ReplayReport> {
    let started = Instant::now();
    dtr.reserve_tables(trace.tensor_count());
    let mut tensors: Vec<Option<TensorId>> = vec![None; trace.tensor_count()];
    let mut reads = Vec::new();
    let mut outcome = (ReplayStatus::Ok, None);
    let mut shared = SharedOutputs::default();
    let mut foresight = dtr.looks_ahead().then(|| Foresight::of(trace));
    // Pin events already carried out ahead of their turn.
    let mut pinned_early: Vec<bool> = Vec::new();
    for (index, event) in trace.events.iter().enumerate() {
        if let Some(foresight) = &mut foresight {
            dtr.set_program_time(foresight.time[index]);
            if let TraceEvent::Apply(apply) = event {
                foresight.tell_lasting_outputs(apply, dtr);
            }
        }
        let stepped = pin_resident_first(trace, index, dtr, &tensors, &mut pinned_early)
            .and_then(|()| match pinned_early.get(index) {
                Some(true) => Ok(()),
                _ => step(
                    trace,
                    index,
                    event,
                    dtr,
                    kernels,
                    &mut tensors,
                    &mut reads,
                    &mut shared,
                ),
            })
            .and_then(|()| {
                if let Some(foresight) = &mut foresight {
                    foresight.after(index, event, dtr, &tensors);
                }
                after_event(index, dtr, &tensors)
            });
        match stepped {
            Ok(()) => {}
            Err(error @ Error::OutOfMemory { .. }) => {
                outcome = (
                    ReplayStatus::OutOfMemory,
                    Some(trace.error_at(index, error).to_string()),
                );
                break;
            }
            Err(error @ Error::Thrash { .. }) => {
                outcome = (
                    ReplayStatus::Thrash,
                    Some(trace.error_at(index, error).to_string()),
                );
                break;
            }
            Err(error @ Error::Trace(_)) => return Err(error),
            Err(error) => return Err(trace.error_at(index, error)),
        }
    }
    Ok(ReplayReport {
        status: outcome.0,
        message: outcome.1,
        stats: dtr.stats().clone(),
        peak_bytes: dtr.memory().peak_bytes,
        reads,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

/// [`Config::pin_resident_first`](crate::Config::pin_resident_first):
/// where a run of pins starts at `index`, pins now those of its tensors
/// that are resident, marking them in `pinned_early` (their events are then
/// passed over; the others are pinned in turn, rematerialised as they are).
fn pin_resident_first<B: Backend>(
    trace: &Trace,
    index: usize,
    dtr: &mut Interpreter<B>,
    tensors: &[Option<TensorId>],
    pinned_early: &mut Vec<bool>,
) -> Result<()> {
    let is_pin = |i: usize| matches!(trace.events.get(i), Some(TraceEvent::Pin { .. }));
    let starts_a_run = is_pin(index) && (index == 0 || !is_pin(index - 1));
    if !(dtr.config().pin_resident_first && starts_a_run) {
        return Ok(());
    }
    pinned_early.resize(trace.events.len(), false);
    let mut at = index;
    while let Some(TraceEvent::Pin { tensor }) = trace.events.get(at) {
        // The trace was validated, so every tensor it names exists by now.
        let tensor = tensors[*tensor as usize].expect("validated trace");
        if dtr.is_resident(tensor)? {
            dtr.pin(tensor)?;
            pinned_early[at] = true;
        }
        at += 1;
    }
    Ok(())
}

/// When the trace reads each tensor, for heuristics that look ahead: the
/// replay tells the interpreter each tensor's next read as it goes.
struct Foresight {
    /// The program's time before each event: the summed costs of the ops
    /// before it.
    time: Vec<u64>,
    /// The events that read each tensor (as an op's input, a get, a pin or
    /// a detach), in order, and how many of them have run.
    reads: Vec<Vec<u32>>,
    done: Vec<u32>,
    /// The tensors the program keeps: those the trace detaches (they
    /// become constants) or never releases (its outputs, held to its end).
    lasting: Vec<bool>,
}

impl Foresight {
    fn of(trace: &Trace) -> Foresight {
        let mut time = Vec::with_capacity(trace.events.len() + 1);
        let mut reads: Vec<Vec<u32>> = vec![Vec::new(); trace.tensor_count()];
        let mut lasting: Vec<bool> = (0..trace.tensor_count())
            .map(|t| trace.held_to_end(t as TraceTensor))
            .collect();
        let mut now = 0u64;
        for (index, event) in trace.events.iter().enumerate() {
            time.push(now);
            match event {
                TraceEvent::Apply(apply) => {
                    for &input in &apply.inputs {
                        reads[input as usize].push(index as u32);
                    }
                    now = now.saturating_add(apply.cost);
                }
                TraceEvent::Get { tensor } | TraceEvent::Pin { tensor } => {
                    reads[*tensor as usize].push(index as u32);
                }
                // A detach needs its tensor's value too: an evicted one is
                // rematerialised first.
                TraceEvent::Detach { tensor } => {
                    reads[*tensor as usize].push(index as u32);
                    lasting[*tensor as usize] = true;
                }
                _ => {}
            }
        }
        time.push(now);
        let done = vec![0; reads.len()];
        Foresight {
            time,
            reads,
            done,
            lasting,
        }
    }

    /// Tells the interpreter which outputs of `apply`, about to run, the
    /// program keeps (see [`Foresight::lasting`]).
    fn tell_lasting_outputs<B: Backend>(&self, apply: &super::Apply, dtr: &mut Interpreter<B>) {
        let marks: smallvec::SmallVec<[bool; 2]> = (apply.outputs.iter())
            .map(|output| self.lasting[output.tensor as usize])
            .collect();
        if marks.contains(&true) {
            dtr.expect_lasting_outputs(&marks);
        }
    }

    /// Event `index` ran: the tensors it read or made are next read later.
    fn after<B: Backend>(
        &mut self,
        index: usize,
        event: &TraceEvent,
        dtr: &mut Interpreter<B>,
        tensors: &[Option<TensorId>],
    ) {
        let mut advance = |t: TraceTensor| {
            let reads = &self.reads[t as usize];
            let done = &mut self.done[t as usize];
            while (*done as usize) < reads.len() && reads[*done as usize] as usize <= index {
                *done += 1;
            }
            let next = reads.get(*done as usize).map(|&at| self.time[at as usize]);
            if let Some(tensor) = tensors[t as usize] {
                dtr.set_next_read(tensor, next);
            }
        };
        match event {
            TraceEvent::Apply(apply) => {
                apply.inputs.iter().for_each(|&t| advance(t));
                apply.outputs.iter().for_each(|o| advance(o.tensor));
            }
            TraceEvent::Put { tensor, .. }
            | TraceEvent::Get { tensor }
            | TraceEvent::Pin { tensor }
            | TraceEvent::Detach { tensor } => advance(*tensor),
            _ => {}
        }
    }
}

/// The distinct output lists of the recorded ops made so far, each held
/// once, so that the nodes of a replay share them.
#[derive(Default)]
struct SharedOutputs(Interner<[RecordedOutput]>);

impl SharedOutputs {
    fn get(&mut self, outputs: &[TraceOutput]) -> Arc<[RecordedOutput]> {
        let list: smallvec::SmallVec<[RecordedOutput; 2]> = outputs
            .iter()
            .map(|o| RecordedOutput {
                bytes: o.bytes,
                alias_of: o.alias_of,
            })
            .collect();
        self.0.get(list.as_slice(), || list.as_slice().into())
    }
}

#[allow(clippy::too_many_arguments)] // the replay's state, passed apart for borrowing
fn step<B: Backend>(
    trace: &Trace,
    index: usize,
    event: &TraceEvent,
    dtr: &mut Interpreter<B>,
    kernels: Kernels,
    tensors: &mut [Option<TensorId>],
    reads: &mut Vec<(TraceTensor, Vec<f32>)>,
    shared: &mut SharedOutputs,
) -> Result<()> {
    // The trace was validated, so every tensor it names exists by now.
    let id = |t: TraceTensor| tensors[t as usize].expect("validated trace");
    match event {
        TraceEvent::Put {
            tensor,
            bytes,
            dims,
            data,
        } => {
            let made = match (kernels, dims, data) {
                (Kernels::Execute, Some(dims), Some(data)) => dtr.put(data, dims)?,
                _ => dtr.put_opaque(*bytes)?,
            };
            tensors[*tensor as usize] = Some(made);
        }
        TraceEvent::Apply(apply) => {
            let crate::trace::Apply {
                op,
                kernel,
                inputs,
                outputs,
                cost,
                module,
            } = &**apply;
            let op = match kernels {
                Kernels::Execute => kernel.as_deref().cloned().ok_or_else(|| {
                    trace.error_at(
                        index,
                        format!("`{op}` has no kernel; replay this trace on the simulator"),
                    )
                })?,
                Kernels::Recorded => Op::Recorded(RecordedOp {
                    call: 0,
                    module: module.clone(),
                    name: op.clone(),
                    cost: *cost,
                    outputs: shared.get(outputs),
                }),
            };
            let inputs: smallvec::SmallVec<[TensorId; 4]> = inputs.iter().map(|&t| id(t)).collect();
            let made = dtr.apply_op_with_cost(op, &inputs, *cost)?;
            if made.len() != outputs.len() {
                return Err(trace.error_at(
                    index,
                    format!(
                        "the op made {} outputs, the trace has {}",
                        made.len(),
                        outputs.len()
                    ),
                ));
            }
            for (output, tensor) in outputs.iter().zip(made) {
                tensors[output.tensor as usize] = Some(tensor);
            }
        }
        TraceEvent::Retain { tensor } => dtr.retain(id(*tensor))?,
        TraceEvent::Del { tensor } => dtr.del(id(*tensor))?,
        TraceEvent::Get { tensor } => reads.push((*tensor, dtr.get_value(id(*tensor))?)),
        TraceEvent::Pin { tensor } => dtr.pin(id(*tensor))?,
        TraceEvent::Unpin { tensor } => dtr.unpin(id(*tensor))?,
        TraceEvent::Detach { tensor } => dtr.detach(id(*tensor))?,
    }
    Ok(())
}

/// The program without DTR: every storage freed when its last reference is
/// dropped, nothing recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Baseline {
    /// Peak bytes, puts included.
    pub peak_bytes: u64,
    /// Summed cost of every op.
    pub compute: u64,
    /// Bytes of all puts.
    pub constant_bytes: u64,
    /// Number of op applications.
    pub ops: usize,
    /// Number of tensors made.
    pub tensors: usize,
    /// No schedule can run the program in less: the largest, over ops, of
    /// the live puts plus the op's inputs and outputs.
    pub lower_bound_bytes: u64,
}

/// Analyses `trace` without running it.
pub fn baseline(trace: &Trace) -> Baseline {
    let n = trace.tensor_count();
    // Each tensor's storage, named by the tensor that allocated it.
    let mut storage_of: Vec<TraceTensor> = (0..n as TraceTensor).collect();
    let mut storage_refs = vec![0u32; n];
    let mut is_put = vec![false; n];
    let (mut in_use, mut live_puts) = (0u64, 0u64);
    let mut result = Baseline {
        peak_bytes: 0,
        compute: 0,
        constant_bytes: 0,
        ops: 0,
        tensors: n,
        lower_bound_bytes: 0,
    };
    for event in &trace.events {
        match event {
            TraceEvent::Put { tensor, bytes, .. } => {
                storage_refs[*tensor as usize] = 1;
                is_put[*tensor as usize] = true;
                in_use = in_use.saturating_add(*bytes);
                live_puts = live_puts.saturating_add(*bytes);
                result.constant_bytes = result.constant_bytes.saturating_add(*bytes);
            }
            TraceEvent::Apply(apply) => {
                let (inputs, outputs, cost) = (&apply.inputs, &apply.outputs, &apply.cost);
                result.ops += 1;
                result.compute = result.compute.saturating_add(*cost);
                let fresh = outputs
                    .iter()
                    .fold(0u64, |sum, o| sum.saturating_add(o.bytes));
                let mut working = fresh;
                let mut seen: smallvec::SmallVec<[TraceTensor; 8]> = smallvec::SmallVec::new();
                for &input in inputs {
                    let storage = storage_of[input as usize];
                    if !is_put[storage as usize] && !seen.contains(&storage) {
                        seen.push(storage);
                        working = working.saturating_add(trace.storage_bytes[storage as usize]);
                    }
                }
                result.lower_bound_bytes = result
                    .lower_bound_bytes
                    .max(live_puts.saturating_add(working));
                for output in outputs {
                    let storage = match output.alias_of {
                        Some(i) => storage_of[inputs[i] as usize],
                        None => output.tensor,
                    };
                    storage_of[output.tensor as usize] = storage;
                    storage_refs[storage as usize] += 1;
                }
                in_use = in_use.saturating_add(fresh);
            }
            TraceEvent::Retain { tensor } => {
                storage_refs[storage_of[*tensor as usize] as usize] += 1
            }
            TraceEvent::Del { tensor } => {
                let storage = storage_of[*tensor as usize] as usize;
                storage_refs[storage] -= 1;
                if storage_refs[storage] == 0 {
                    in_use = in_use.saturating_sub(trace.storage_bytes[storage]);
                    if is_put[storage] {
                        live_puts = live_puts.saturating_sub(trace.storage_bytes[storage]);
                    }
                }
            }
            TraceEvent::Get { .. }
            | TraceEvent::Pin { .. }
            | TraceEvent::Unpin { .. }
            | TraceEvent::Detach { .. } => {}
        }
        result.peak_bytes = result.peak_bytes.max(in_use);
    }
    result
}
