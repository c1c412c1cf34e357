//! (Re)computing nodes. Missing inputs are rematerialised depth-first on an
//! explicit stack, never native recursion, so an evicted chain of any
//! length regenerates in constant native stack.
//!
//! Every pending frame holds locks on its defined inputs, as the DTR
//! authors' runtime does. A deep rematerialisation can then lock more than
//! the budget leaves: when the op on top cannot get room, [lock
//! relaxation](crate::Config::lock_relaxation) lets the heuristic also
//! evict what the frames below hold, for that one op. A frame recomputes
//! what it lost this way when it resumes, and never surrenders the same
//! input twice: each frame then pushes at most two children per input, so
//! a rematerialisation always ends.
//!
//! In an arena, an op whose inputs were restored one after another can
//! find them splitting the free space: the bytes are there, no block holds
//! the output. Such an op is tried once more the other way round, its
//! outputs' blocks reserved first and its inputs restored around them (see
//! [`Interpreter::reserve_outputs_first`]).

use smallvec::{smallvec, SmallVec};

use super::eviction::RoomFor;
use super::{Interpreter, RunEvent};
use crate::backend::{Backend, BufferView};
use crate::error::{Error, Result};
use crate::graph::{NodeId, StorageId};
use crate::memory::Block;

/// How to restore a frame's missing input.
enum Missing {
    /// Run the op that produces it.
    Recompute(NodeId),
    /// Copy its storage back from host memory.
    SwapIn(StorageId),
}

/// A node waiting for its inputs.
struct Frame {
    node: NodeId,
    /// Inputs before this one are locked.
    next_input: usize,
    /// Which input positions hold a lock (an input used twice is locked twice).
    locked: SmallVec<[bool; 8]>,
    /// Input positions already evicted once by lock relaxation.
    lost: SmallVec<[bool; 8]>,
    /// Blocks reserved for the node's outputs before its inputs were
    /// restored (the retry of an op that fragmentation left without room).
    outputs: Option<SmallVec<[Block; 2]>>,
}

impl<B: Backend> Interpreter<B> {
    /// Runs `root` once every input is defined, rematerialising inputs as
    /// needed. `first_run` marks a user's new op (it counts as baseline
    /// compute, not as rematerialisation). On error every lock taken here is
    /// released, and whatever was recomputed stays resident and evictable.
    ///
    /// Under `hybrid`, a rematerialisation that runs out of memory is tried
    /// once more restoring from host copies every input that has one (see
    /// [`Self::may_retry_from_host_copies`]), and if that runs out too,
    /// once more parking: the pending ops surrender their locks, and the
    /// inputs evicted then leave by copy and come back by copy (see
    /// [`Self::retry_surrendering`]). Runs that never met the error are
    /// unchanged.
    pub(super) fn materialize(&mut self, root: NodeId, first_run: bool) -> Result<()> {
        match self.materialize_once(root, first_run) {
            Err(Error::OutOfMemory { .. }) if self.may_retry_from_host_copies() => {
                tracing::debug!(target: "dtr::swap", "out of memory recomputing; trying again from host copies");
                self.copies.prefer_host_copies = true;
                let mut retried = self.materialize_once(root, first_run);
                if matches!(retried, Err(Error::OutOfMemory { .. })) {
                    tracing::debug!(target: "dtr::swap", "out of memory again; parking the pending ops' inputs in host memory");
                    self.copies.parking = true;
                    retried = self.materialize_once(root, first_run);
                    self.copies.parking = false;
                }
                self.copies.prefer_host_copies = false;
                retried
            }
            other => other,
        }
    }

    fn materialize_once(&mut self, root: NodeId, first_run: bool) -> Result<()> {
        let mut stack = vec![self.begin(root)];
        while let Some(top) = stack.len().checked_sub(1) {
            match self.lock_defined_inputs(&mut stack[top]) {
                Some(Missing::Recompute(producer)) => {
                    let frame = self.begin(producer);
                    stack.push(frame);
                }
                Some(Missing::SwapIn(storage)) => {
                    let swapped = match self.swap_in(storage) {
                        Err(error @ Error::OutOfMemory { .. }) if self.relaxes_locks() => {
                            let node = stack[top].node;
                            self.retry_surrendering(node, &mut stack, error, |dtr| {
                                dtr.swap_in(storage)
                            })
                        }
                        other => other,
                    };
                    if let Err(error) = swapped.and_then(|()| self.check_thrash()) {
                        for frame in stack.iter_mut().rev() {
                            self.release(frame);
                        }
                        return Err(error);
                    }
                }
                None => {
                    let mut frame = stack.pop().expect("stack is not empty");
                    let rematerializing = !(first_run && stack.is_empty());
                    let outputs = frame.outputs.take();
                    let retry_allowed = outputs.is_none();
                    // Only recomputation counts towards the limit, so a user's own op
                    // that ran is never undone by it.
                    let result = self
                        .run_relaxing(frame.node, rematerializing, &mut stack, outputs)
                        .and_then(|()| {
                            if rematerializing {
                                self.check_thrash()
                            } else {
                                Ok(())
                            }
                        });
                    self.unlock_inputs(&frame);
                    let result = match result {
                        Err(error) if retry_allowed && self.fragmented(&error, frame.node) => {
                            match self.reserve_outputs_first(frame.node, rematerializing) {
                                Ok(Some(frame)) => {
                                    stack.push(frame);
                                    continue;
                                }
                                Ok(None) => Err(error),
                                Err(other) => Err(other),
                            }
                        }
                        other => other,
                    };
                    if let Err(mut error) = result {
                        // The ops waiting on this one, innermost first.
                        if let Error::OutOfMemory { chain, .. } = &mut error {
                            *chain = stack
                                .iter()
                                .rev()
                                .map(|f| self.graph.nodes[f.node].op().name().to_string())
                                .collect();
                        }
                        for frame in stack.iter_mut().rev() {
                            self.release(frame);
                        }
                        return Err(error);
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs a node; if it cannot get room while `pending` frames hold
    /// locks, surrenders those locks (but on inputs a frame lost before)
    /// and retries once. Afterwards the surrendered inputs still resident
    /// are locked again; the evicted ones are lost to their frames, which
    /// will recompute them.
    fn run_relaxing(
        &mut self,
        node: NodeId,
        rematerializing: bool,
        pending: &mut [Frame],
        outputs: Option<SmallVec<[Block; 2]>>,
    ) -> Result<()> {
        if outputs.is_some() {
            // Its room is there already.
            return self.run_node(node, rematerializing, outputs);
        }
        let error = match self.run_node(node, rematerializing, None) {
            Err(error @ Error::OutOfMemory { .. }) if self.relaxes_locks() => error,
            other => return other,
        };
        self.retry_surrendering(node, pending, error, |dtr| {
            dtr.run_node(node, rematerializing, None)
        })
    }

    /// Whether a pending frame's locks may be surrendered when the op on
    /// top cannot get room: under lock relaxation, or while parking.
    fn relaxes_locks(&self) -> bool {
        self.config.lock_relaxation || self.copies.parking
    }

    /// Surrenders the `pending` frames' locks (but on inputs a frame lost
    /// before) and runs `retry` once; fails with `error` if there was
    /// nothing to surrender. While parking, a surrendered input that is
    /// evicted leaves by copy. Afterwards the surrendered inputs still
    /// resident are locked again; the evicted ones are lost to their
    /// frames, which will restore them.
    fn retry_surrendering(
        &mut self,
        node: NodeId,
        pending: &mut [Frame],
        error: Error,
        retry: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let mut surrendered = Vec::new();
        for (f, frame) in pending.iter_mut().enumerate() {
            for i in 0..frame.locked.len() {
                if frame.locked[i] && !frame.lost[i] {
                    frame.locked[i] = false;
                    let storage = self.input_storage(frame.node, i);
                    if self.copies.parking {
                        self.leave_by_copy(storage);
                    }
                    self.table.unlock(&self.graph, storage);
                    surrendered.push((f, i));
                }
            }
        }
        if surrendered.is_empty() {
            return Err(error);
        }
        let event = RunEvent::LocksRelaxed {
            node,
            surrendered: surrendered.len(),
        };
        self.observers.notify(&event, &self.graph);
        let result = retry(self);
        for (f, i) in surrendered {
            let frame = &mut pending[f];
            let storage = self.input_storage(frame.node, i);
            if self.graph.storages[storage].is_resident() {
                self.table.lock(storage);
                frame.locked[i] = true;
            } else {
                frame.lost[i] = true;
                frame.next_input = frame.next_input.min(i);
            }
        }
        result
    }

    fn input_storage(&self, node: NodeId, input: usize) -> StorageId {
        self.graph.tensors[self.graph.nodes[node].inputs()[input]].storage
    }

    fn check_thrash(&mut self) -> Result<()> {
        let stats = &self.observers.stats;
        let budget_cost = stats.budget_cost();
        let budgeted = self.table.counter().budget_bytes().is_some();
        let by_ratio = (self.config.remat_ratio_limit)
            .filter(|_| budgeted)
            .map(|ratio| (ratio * stats.baseline_compute as f64) as u64);
        let limit = match (self.config.remat_limit, by_ratio) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match limit {
            Some(limit) if budget_cost > limit => {
                let event = RunEvent::Thrashing { budget_cost, limit };
                self.observers.notify(&event, &self.graph);
                Err(Error::Thrash {
                    remat_compute: budget_cost,
                    limit,
                })
            }
            _ => Ok(()),
        }
    }

    /// Marks `node`'s inputs accessed and locks those already defined, so
    /// rematerialising the others cannot evict them.
    fn begin(&mut self, node: NodeId) -> Frame {
        let count = self.graph.nodes[node].inputs().len();
        let mut frame = Frame {
            node,
            next_input: 0,
            locked: smallvec![false; count],
            lost: smallvec![false; count],
            outputs: None,
        };
        for i in 0..count {
            let storage = self.graph.tensors[self.graph.nodes[node].inputs()[i]].storage;
            self.touch(storage);
        }
        for i in 0..count {
            let tensor = self.graph.nodes[node].inputs()[i];
            if self.graph.tensors[tensor].defined {
                self.table.lock(self.graph.tensors[tensor].storage);
                frame.locked[i] = true;
            }
        }
        frame
    }

    /// Locks inputs in order while they are defined; returns how to restore
    /// the first undefined one, or `None` when all are locked.
    fn lock_defined_inputs(&mut self, frame: &mut Frame) -> Option<Missing> {
        let count = frame.locked.len();
        while frame.next_input < count {
            let i = frame.next_input;
            if !frame.locked[i] {
                let info = &self.graph.tensors[self.graph.nodes[frame.node].inputs()[i]];
                if !info.defined {
                    let (storage, producer) = (info.storage, info.producer);
                    if !self.graph.storages[storage].is_resident()
                        && self.restores_from_host(storage)
                    {
                        return Some(Missing::SwapIn(storage));
                    }
                    let producer = producer.expect("only recomputable storages are evicted");
                    return Some(Missing::Recompute(producer));
                }
                self.table.lock(info.storage);
                frame.locked[i] = true;
            }
            frame.next_input += 1;
        }
        None
    }

    /// Whether `error` is an arena's out-of-memory for `node`'s outputs
    /// that its inputs, now unlocked, may have caused by where they lie:
    /// evicting every candidate would free bytes enough. A plan being
    /// followed says so itself, where its recorded run retried.
    fn fragmented(&self, error: &Error, node: NodeId) -> bool {
        if !matches!(error, Error::OutOfMemory { .. }) {
            return false;
        }
        if self.follows_plan() {
            return self.plan_reserves_outputs_first();
        }
        self.table.memory().arena().is_some()
            && (self.table.memory())
                .could_fit(&self.output_sizes(node), self.table.unevictable_bytes())
    }

    /// The retry of `node` after fragmentation left its outputs no room
    /// with its inputs locked where they were restored: its inputs are
    /// unlocked (the caller has done so) and its outputs' blocks reserved
    /// first, evicting as the policy chooses (the inputs included); the
    /// frame returned then restores the inputs around those blocks. Each
    /// frame is retried at most once. `None` when the outputs find no room
    /// this way either (other errors, such as a departure from a plan
    /// being followed, are returned).
    fn reserve_outputs_first(
        &mut self,
        node: NodeId,
        rematerializing: bool,
    ) -> Result<Option<Frame>> {
        let sizes = self.output_sizes(node);
        let room = RoomFor::Op {
            node,
            rematerializing,
        };
        let recorded = self.recorded_reservations();
        let reserved = self.reserve(&sizes, room);
        self.schedule_outputs_first(recorded);
        let blocks = match reserved {
            Ok(blocks) => blocks,
            Err(Error::OutOfMemory { .. }) => return Ok(None),
            Err(other) => return Err(other),
        };
        let event = RunEvent::OutputsReservedFirst { node };
        self.observers.notify(&event, &self.graph);
        let mut frame = self.begin(node);
        frame.outputs = Some(blocks.into_iter().collect());
        Ok(Some(frame))
    }

    /// Unlocks a frame given up on error, and returns the blocks it
    /// reserved ahead.
    fn release(&mut self, frame: &mut Frame) {
        self.unlock_inputs(frame);
        for block in frame.outputs.take().into_iter().flatten() {
            self.table.unreserve(block);
        }
    }

    /// The bytes of a block for every fresh output of `node`, those still
    /// resident included: the op writes all its outputs before duplicates
    /// are dropped.
    fn output_sizes(&self, node: NodeId) -> SmallVec<[u64; 2]> {
        self.graph.nodes[node]
            .signature()
            .outputs
            .iter()
            .filter(|o| o.alias_of.is_none())
            .map(|o| o.bytes)
            .collect()
    }

    fn unlock_inputs(&mut self, frame: &Frame) {
        for (i, &locked) in frame.locked.iter().enumerate() {
            if locked {
                let tensor = self.graph.nodes[frame.node].inputs()[i];
                self.table
                    .unlock(&self.graph, self.graph.tensors[tensor].storage);
            }
        }
    }

    /// Makes room for the node's outputs (unless `reserved` already), runs
    /// it, and installs the outputs that are missing; outputs still
    /// resident (or freed) are dropped.
    fn run_node(
        &mut self,
        node_id: NodeId,
        rematerializing: bool,
        reserved: Option<SmallVec<[Block; 2]>>,
    ) -> Result<()> {
        let reserved: Vec<Block> = match reserved {
            Some(blocks) => blocks.into_vec(),
            None => {
                let sizes = self.output_sizes(node_id);
                let room = RoomFor::Op {
                    node: node_id,
                    rematerializing,
                };
                self.reserve(&sizes, room)?
            }
        };
        if self.has_unread_prefetches() {
            for i in 0..self.graph.nodes[node_id].inputs().len() {
                let input = self.graph.nodes[node_id].inputs()[i];
                self.await_arrival(self.graph.tensors[input].storage);
            }
        }
        let placed = self
            .table
            .memory()
            .arena()
            .is_some()
            .then_some(reserved.as_slice());

        let node = &self.graph.nodes[node_id];
        let views: SmallVec<[BufferView<'_, B::Buffer>; 4]> = node
            .inputs()
            .iter()
            .map(|&t| {
                let info = &self.graph.tensors[t];
                BufferView {
                    buffer: self.table.buffer(info.storage),
                    layout: &info.layout,
                }
            })
            .collect();
        let results = self
            .backend
            .execute(node.op(), &views, node.signature(), placed);
        let mut blocks = reserved.into_iter();
        drop(views);
        let results = match results {
            Ok(results) => results,
            Err(error) => {
                blocks.for_each(|block| self.table.unreserve(block));
                return Err(error);
            }
        };
        let shapes_match = results.len() == node.signature().outputs.len()
            && results
                .iter()
                .zip(&node.signature().outputs)
                .all(|(r, spec)| r.is_some() == spec.alias_of.is_none());
        if !shapes_match {
            let backend = self.backend.name();
            let op_name = node.op().name().to_string();
            for buffer in results.into_iter().flatten() {
                self.backend.release(buffer);
            }
            blocks.for_each(|block| self.table.unreserve(block));
            return Err(Error::backend(
                backend,
                format!("`{op_name}` returned buffers that do not match its outputs"),
            ));
        }

        let cost = node.cost();
        self.graph.clock = self.graph.clock.saturating_add(cost);
        let mut restored = None;
        for (k, buffer) in results.into_iter().enumerate() {
            // Fresh outputs have buffers, and blocks in the same order.
            let block = buffer
                .as_ref()
                .map(|_| blocks.next().expect("a block per fresh output"));
            let missing = self.graph.nodes[node_id]
                .output(k)
                .filter(|&t| !self.graph.tensors[t].defined);
            let Some(tensor) = missing else {
                // Freed, or still resident: the fresh copy is discarded.
                if let (Some(buffer), Some(block)) = (buffer, block) {
                    self.backend.release(buffer);
                    self.table.unreserve(block);
                }
                continue;
            };
            restored.get_or_insert(tensor);
            let storage = self.graph.tensors[tensor].storage;
            if let (Some(buffer), Some(block)) = (buffer, block) {
                self.table.install(&mut self.graph, storage, buffer, block);
                self.queue_write_back(storage);
                if rematerializing {
                    self.heuristic.on_rematerialize(storage, &self.graph);
                    self.note_restored(storage);
                } else {
                    self.heuristic.on_graph_change(storage, &self.graph);
                }
            }
            self.graph.tensors[tensor].defined = true;
        }

        let event = RunEvent::Ran {
            node: node_id,
            cost,
            rematerializing,
            restored,
        };
        self.observers.notify(&event, &self.graph);
        self.write_back();
        if !rematerializing {
            self.resume_prefetch();
        }
        self.prefetch();
        Ok(())
    }
}
