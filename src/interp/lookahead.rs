//! Foresight from the step before: a training loop reads its tensors in
//! the same order every step, so once the program marks steps
//! ([`Interpreter::mark_step`]), the last step tells a heuristic that looks
//! ahead (`dtr-next`) when each tensor of this one will next be read, as a
//! replay of a recorded trace tells it from the trace. With no foresight
//! `dtr-next` is `dtr`, which on a recurrent network's long chains evicts
//! what the backward pass needs next (see the README's measurements).
//!
//! A read is an op's input, or a read outside ops: a get or an
//! `ensure_resident` (the host's) and a detach, which needs the value in
//! memory. Not a pin: `dtr.torch` pins an op's inputs while one of them is
//! restored, so pins come where evictions happened to fall, and counting
//! them shifted every later read of the tensor in the next step's
//! foresight (a GPT-2 step under `dtr-next` recomputed 7,296 ops instead
//! of 1,215). Each step records,
//! for every tensor it read (named as [`StepTensor`]: by the op of the
//! step that made it), the program's time at each read, its time being the
//! summed costs of its ops before. The next step, while its ops are the
//! last step's (the same fingerprints, op by op), sets each tensor's next
//! read to the last step's read after as many as it has had. From the first other op the step has
//! no foresight (`dtr-next` is `dtr` again) until the next mark. Values never
//! depend on it: a wrong guess costs recomputation.

use std::collections::HashMap;

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use super::steps::StepTensor;
use super::Interpreter;
use crate::backend::Backend;
use crate::graph::{NodeId, TensorId};

/// One step's ops and reads, as the next step foresees them.
#[derive(Default)]
struct StepReads {
    /// The program's time before each op: the summed costs of those before.
    times: Vec<u64>,
    /// The fingerprint of the ops up to each one (see [`Interpreter::mark_step`]).
    fingerprints: Vec<u64>,
    /// When each tensor was read, in order.
    reads: HashMap<StepTensor, SmallVec<[u64; 2]>, foldhash::fast::RandomState>,
}

/// The last step's reads and the step under way's.
#[derive(Default)]
pub(super) struct Lookahead {
    /// The last step, once one has been recorded whole.
    last: Option<StepReads>,
    /// The step under way.
    record: StepReads,
    /// Its program time.
    now: u64,
    /// How many times it has read each tensor so far.
    done: SecondaryMap<TensorId, u32>,
    /// Whether it has repeated the last step so far.
    repeating: bool,
}

impl<B: Backend> Interpreter<B> {
    /// A step starts: what the last one read becomes the foresight of
    /// this one. Returns, when the heuristic looks ahead from steps,
    /// whether the step that ended did from start to end (so its evictions
    /// are a plan worth following).
    pub(super) fn lookahead_next_step(&mut self) -> Option<bool> {
        if !self.heuristic.looks_ahead() || self.foresight_given {
            return None;
        }
        // The first mark starts the first record: nothing to foresee yet.
        let first_mark = self.lookahead.is_none();
        let lookahead = self.lookahead.get_or_insert_with(Default::default);
        let informed = lookahead.last.is_some() && lookahead.repeating;
        lookahead.last = (!first_mark).then(|| std::mem::take(&mut lookahead.record));
        lookahead.now = 0;
        lookahead.done.clear();
        lookahead.repeating = lookahead.last.is_some();
        self.graph.forget_next_reads();
        let foresight = &mut self.graph.foresight;
        foresight.known = lookahead.repeating;
        foresight.now = 0;
        // Tensors made before the step are read first when the last step did
        // (set directly: forgetting every next read just now marked them all
        // changed).
        if let Some(last) = &lookahead.last {
            for (name, reads) in &last.reads {
                if let (StepTensor::Earlier(tensor), Some(&first)) = (name, reads.first()) {
                    if self.graph.tensors.contains_key(*tensor) {
                        foresight.next_read.insert(*tensor, first);
                    }
                }
            }
        }
        Some(informed)
    }

    /// Op number `position` of the step starts, its ops so far fingerprinted
    /// `fingerprint`: the program's time is the last step's there, if the
    /// step still repeats it.
    pub(super) fn lookahead_op_starts(&mut self, position: usize, fingerprint: u64) {
        let Some(lookahead) = &mut self.lookahead else {
            return;
        };
        lookahead.record.times.push(lookahead.now);
        lookahead.record.fingerprints.push(fingerprint);
        if !lookahead.repeating {
            return;
        }
        let last = lookahead.last.as_ref().expect("repeating a recorded step");
        match last.times.get(position) {
            Some(&time) if last.fingerprints[position] == fingerprint => {
                self.graph.foresight.now = time;
            }
            _ => {
                tracing::debug!(target: "dtr::evict", op = position, "the step departs from the last one; no foresight until the next step");
                lookahead.repeating = false;
                self.graph.foresight.known = false;
                self.graph.forget_next_reads();
            }
        }
    }

    /// `node` ran: its inputs were read, and each one's and each output's
    /// next read is the last step's after as many reads.
    pub(super) fn lookahead_op_ran(&mut self, node: NodeId) {
        if self.lookahead.is_none() {
            return;
        }
        let info = &self.graph.nodes[node];
        let reads: SmallVec<[(TensorId, Option<StepTensor>); 4]> = (info.inputs().iter().copied())
            .chain(info.live_outputs())
            .map(|t| (t, self.step_tensor(t)))
            .collect();
        let inputs = info.inputs().len();
        let cost = info.cost();
        for (k, &(tensor, name)) in reads.iter().enumerate() {
            if let Some(name) = name {
                self.note_read(tensor, name, k < inputs);
            }
        }
        let lookahead = self.lookahead.as_mut().expect("checked above");
        lookahead.now = lookahead.now.saturating_add(cost);
    }

    /// `tensor` is read outside an op, where its value must be in memory:
    /// the host reads it (a get, an `ensure_resident`) or it becomes a
    /// constant (a detach, as before a parameter it was computed from
    /// changes in place). It counts as an op's read does, so a tensor the last step
    /// read only so (a loss held through the optimiser's step) is not taken
    /// for one never read again.
    pub(super) fn lookahead_read(&mut self, tensor: TensorId) {
        if self.lookahead.is_none() {
            return;
        }
        if let Some(name) = self.step_tensor(tensor) {
            self.note_read(tensor, name, true);
        }
    }

    /// Records a read of `tensor` (named `name` in the step) now, if
    /// `read`, and sets its next read to the last step's after as many.
    fn note_read(&mut self, tensor: TensorId, name: StepTensor, read: bool) {
        let lookahead = self.lookahead.as_mut().expect("recording reads");
        let done = if read {
            (lookahead.record.reads.entry(name).or_default()).push(lookahead.now);
            let done = lookahead.done.entry(tensor).expect("live tensor");
            let count = done.or_insert(0);
            *count += 1;
            *count as usize
        } else {
            0
        };
        if lookahead.repeating {
            let last = lookahead.last.as_ref().expect("repeating a recorded step");
            let next = last.reads.get(&name).and_then(|at| at.get(done));
            self.graph.set_next_read(tensor, next.copied());
        }
    }
}
