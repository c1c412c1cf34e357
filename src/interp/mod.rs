//! The eager interpreter: `put`, `apply_op`, `del` and `get_value` under a
//! memory budget, evicting and rematerialising transparently.
//!
//! Module map: this file holds the public instructions; `materialize`
//! (re)computes nodes on an explicit stack; `eviction` makes room and keeps
//! the candidate pool; `release` handles dropped handles (eager eviction and
//! real frees); `storage` owns where every storage's bytes are; `schedule`
//! records and follows static plans, and `steps` repeats the last marked
//! step's evictions.

mod eviction;
mod footprint;
mod lookahead;
mod materialize;
mod observer;
mod release;
mod schedule;
mod stats;
mod steps;
mod storage;
mod swap;

pub use observer::{EventLog, Observer, RunEvent, TensorInstruction, TracingLog};
pub use schedule::{BlockMove, PlanRecord, Reservation};
pub use stats::{Event, Stats};

use slotmap::SecondaryMap;
use smallvec::SmallVec;

use crate::backend::Backend;
use crate::config::{Budget, Config};
use crate::error::{Error, Result};
use crate::graph::{
    Consumers, Graph, NodeId, OpNode, Residency, StorageId, StorageInfo, TensorId, TensorInfo,
};
use crate::memory::{Block, Memory};
use crate::ops::{Op, ELEMENT_BYTES};
use crate::policy::{CandidateSearch, Heuristic};
use crate::shape::Layout;
use storage::StorageTable;

/// Runs ops on a backend, keeping memory within the budget by evicting
/// storages and recomputing them when they are needed again.
///
/// ```
/// use dtr::{Config, CpuBackend, Interpreter, Op, ScalarOp};
/// let mut dtr = Interpreter::new(CpuBackend::new(), Config::default().with_budget_bytes(64))?;
/// let x = dtr.put(&[1.0, 2.0], &[2])?;
/// let y = dtr.apply1(Op::Scalar { op: ScalarOp::Mul, value: 3.0 }, &[x])?;
/// assert_eq!(dtr.get_value(y)?, vec![3.0, 6.0]);
/// # Ok::<(), dtr::Error>(())
/// ```
pub struct Interpreter<B: Backend> {
    backend: B,
    graph: Graph,
    /// Where every storage's bytes are: memory, buffers, locks, candidates.
    table: StorageTable<B>,
    heuristic: Box<dyn Heuristic>,
    heuristic_name: &'static str,
    search: CandidateSearch,
    config: Config,
    /// Counters, the event log, `tracing` and the user's observer.
    observers: observer::Observers,
    /// The copy queue's time and write-back backlog (swap).
    copies: swap::CopyQueue,
    /// A static plan being recorded or followed.
    schedule: Option<schedule::Schedule>,
    /// The last step's evictions, once the program marks steps.
    steps: Option<steps::StepPlans>,
    /// The rematerialisation guard's scratch space.
    footprint: footprint::RematFootprint,
    /// The last step's reads, foreseen in this one, once the program marks
    /// steps and the heuristic looks ahead.
    lookahead: Option<lookahead::Lookahead>,
    /// A replay tells the foresight ([`Interpreter::set_program_time`]):
    /// steps do not.
    foresight_given: bool,
    /// Which outputs of the next op the program keeps
    /// ([`Interpreter::expect_lasting_outputs`]).
    lasting_next: SmallVec<[bool; 2]>,
}

/// Bytes in use, their high-water mark and the budget; in arena mode also
/// the allocator's view (bytes are then counted as allocated, aligned).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryReport {
    /// Bytes held by resident storages now.
    pub in_use_bytes: u64,
    /// The most bytes held at once so far.
    pub peak_bytes: u64,
    /// The budget, if any.
    pub budget_bytes: Option<u64>,
    /// The most bytes held at once by resident storages that cannot be
    /// recomputed (puts, detached tensors).
    pub constant_peak_bytes: u64,
    /// Bytes of host copies (swap) now, and at most so far.
    pub host_bytes: u64,
    /// The most bytes of host copies held at once so far.
    pub host_peak_bytes: u64,
    /// The arena's own report, in arena memory.
    pub arena: Option<crate::memory::ArenaReport>,
}

/// `fraction` of the backend's device memory, in bytes.
fn device_budget<B: Backend>(backend: &B, fraction: f64) -> Result<u64> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(Error::InvalidArgument(format!(
            "device memory fraction {fraction} is not in (0, 1]"
        )));
    }
    let total = backend.device_memory_bytes().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the {} backend cannot tell its device memory; give the budget in bytes",
            backend.name()
        ))
    })?;
    Ok((fraction * total as f64).floor() as u64)
}

impl<B: Backend> Interpreter<B> {
    /// An interpreter on `backend`; a budget given as a ratio is resolved
    /// to bytes of the backend's device memory now.
    pub fn new(backend: B, mut config: Config) -> Result<Interpreter<B>> {
        let budget_bytes = match config.budget {
            Budget::Bytes(bytes) => Some(bytes),
            Budget::Ratio(fraction) => Some(device_budget(&backend, fraction)?),
            Budget::Unbounded => None,
        };
        config.budget = budget_bytes.into();
        let policy = crate::policy::heuristic(&config.heuristic)?;
        if config.restore != crate::config::RestoreMode::Drop {
            config.swap.validate()?;
            if !backend.can_swap() {
                return Err(Error::InvalidArgument(format!(
                    "the {} backend cannot swap to host memory; restore by `drop`",
                    backend.name()
                )));
            }
        }
        if let crate::memory::MemoryModel::CompactingArena { .. } = config.memory {
            Config::validate_move_bandwidth(config.move_bandwidth)?;
        }
        if let Some(ratio) = config
            .remat_ratio_limit
            .filter(|r| !(r.is_finite() && *r > 0.0))
        {
            return Err(Error::InvalidArgument(format!(
                "the rematerialisation ratio limit must be a positive number, not {ratio}"
            )));
        }
        let heuristic = policy.build(config.seed);
        let mut table = StorageTable::new(
            Memory::new(config.memory, budget_bytes),
            config.min_evictable_bytes,
        );
        table.keep_summaries(config.sampling == crate::policy::Sampling::Sqrt);
        // An exact search visits candidates in the heuristic's order, when
        // it has one (`swap` scores by its own cost, in pool order).
        if let (crate::policy::Sampling::All, Some(from)) = (config.sampling, config.ordered_search)
        {
            if config.restore != crate::config::RestoreMode::Swap {
                table.keep_order(heuristic.pool_order(), from);
            }
        }
        Ok(Interpreter {
            backend,
            graph: Graph::new(),
            table,
            heuristic,
            heuristic_name: policy.name,
            search: CandidateSearch::new(config.sampling, config.seed),
            observers: observer::Observers {
                log: config.record_events.then(EventLog::default),
                ..Default::default()
            },
            config,
            copies: swap::CopyQueue::default(),
            schedule: None,
            steps: None,
            footprint: Default::default(),
            lookahead: None,
            foresight_given: false,
            lasting_next: SmallVec::new(),
        })
    }

    /// Whether the heuristic looks ahead: it reads when the program next
    /// reads each tensor, which [`Interpreter::set_next_read`] tells it (a
    /// replay of a recorded trace does).
    pub fn looks_ahead(&self) -> bool {
        self.heuristic.looks_ahead()
    }

    /// The program's own time now (its ops' summed costs so far,
    /// recomputations not counted), for heuristics that look ahead.
    pub fn set_program_time(&mut self, now: u64) {
        self.foresight_given = true;
        self.graph.foresight.known = true;
        self.graph.foresight.now = now;
    }

    /// When, in the program's time, it next reads `tensor` (an op's input,
    /// a get or a pin); `None`: never again. For heuristics that look ahead.
    pub fn set_next_read(&mut self, tensor: TensorId, at: Option<u64>) {
        self.foresight_given = true;
        self.graph.set_next_read(tensor, at);
    }

    /// Which outputs of the next op (`marks[k]` for output `k`) the program
    /// keeps, as a replay knows: it detaches them (a gradient the optimiser
    /// keeps) or holds them to its end (the outputs of a recorded step). In
    /// an arena they are placed apart from the storages that come and go
    /// ([`StorageInfo::lasting`]). Other ops are unaffected.
    pub fn expect_lasting_outputs(&mut self, marks: &[bool]) {
        self.lasting_next.clear();
        self.lasting_next.extend_from_slice(marks);
    }

    /// Makes room for about `tensors` more tensors (and as many storages
    /// and ops) at once, instead of growing the tables as they fill: a
    /// replay knows its trace's count. It changes no decision.
    pub fn reserve_tables(&mut self, tensors: usize) {
        self.graph.tensors.reserve(tensors);
        self.graph.storages.reserve(tensors);
        self.graph.nodes.reserve(tensors);
    }

    /// Uploads host data as a new tensor. Puts have no compute path, so they
    /// are never evicted; they are freed when no one can need them.
    pub fn put(&mut self, data: &[f32], dims: &[usize]) -> Result<TensorId> {
        if crate::shape::checked_numel(dims) != Some(data.len()) {
            return Err(Error::InvalidArgument(format!(
                "put: {} values given for shape {dims:?}",
                data.len()
            )));
        }
        let layout = Layout::contiguous(dims);
        let bytes = layout.numel() as u64 * ELEMENT_BYTES;
        self.put_storage(layout, bytes, Some(data))
    }

    /// A put of `bytes` whose values are unknown (zeros on data backends):
    /// the constants of a data-free trace.
    pub fn put_opaque(&mut self, bytes: u64) -> Result<TensorId> {
        let layout = Layout::contiguous(&[bytes.div_ceil(ELEMENT_BYTES) as usize]);
        self.put_storage(layout, bytes, None)
    }

    /// A put whose buffer the caller already made: a tensor of a foreign
    /// framework, say, which dtr then accounts and keeps like any put.
    /// Room for `bytes` is made by evicting first; on error the buffer is
    /// dropped and nothing else changes but the eviction state.
    pub fn adopt(&mut self, bytes: u64, buffer: B::Buffer) -> Result<TensorId> {
        let block = self.reserve(&[bytes], eviction::RoomFor::Adopt)?[0];
        let layout = Layout::contiguous(&[bytes.div_ceil(ELEMENT_BYTES) as usize]);
        let tensor = self.insert_put(layout, bytes, block, buffer);
        let event = RunEvent::Put {
            tensor,
            bytes,
            dims: &[],
            data: None,
        };
        self.observers.notify(&event, &self.graph);
        Ok(tensor)
    }

    /// Reserves memory, fills it (with `data`, or zeros) and records a put.
    fn put_storage(
        &mut self,
        layout: Layout,
        bytes: u64,
        data: Option<&[f32]>,
    ) -> Result<TensorId> {
        let block = self.reserve(&[bytes], eviction::RoomFor::Put(&layout.dims))?[0];
        let at = self.table.memory().arena().map(|_| block);
        let filled = match data {
            Some(data) => self.backend.upload(data, &layout, at),
            None => self.backend.allocate(&layout, bytes, at),
        };
        let buffer = match filled {
            Ok(buffer) => buffer,
            Err(error) => {
                self.table.unreserve(block);
                return Err(error);
            }
        };
        let tensor = self.insert_put(layout, bytes, block, buffer);
        // Opaque puts record no shape: their values are unknown anyway.
        let dims = match data {
            Some(_) => &self.graph.tensors[tensor].layout.dims[..],
            None => &[],
        };
        let event = RunEvent::Put {
            tensor,
            bytes,
            dims,
            data,
        };
        self.observers.notify(&event, &self.graph);
        Ok(tensor)
    }

    fn insert_put(
        &mut self,
        layout: Layout,
        bytes: u64,
        block: Block,
        buffer: B::Buffer,
    ) -> TensorId {
        let storage = self.new_storage(bytes, false);
        self.table.install(&mut self.graph, storage, buffer, block);
        let layout = self.graph.layout(&layout);
        let tensor = self.graph.tensors.insert(TensorInfo {
            producer: None,
            output: 0,
            storage,
            layout,
            defined: true,
            user_refs: 1,
            consumers: Consumers::default(),
        });
        self.graph.storages[storage].tensors.push(tensor);
        self.refresh_storage_cost(storage);
        // An idle copy queue starts on it at once.
        self.queue_write_back(storage);
        self.write_back();
        tensor
    }

    /// Applies `op` to `inputs` and returns its outputs, one handle each.
    /// Evicted inputs are rematerialised first; room for the outputs is made
    /// by evicting. On error nothing changes but the eviction state.
    pub fn apply_op(&mut self, op: Op, inputs: &[TensorId]) -> Result<SmallVec<[TensorId; 2]>> {
        self.apply_op_costed(op, inputs, None)
    }

    /// [`Interpreter::apply_op`] with the op's cost given (a measured time,
    /// say) instead of estimated. The cost is what rematerialising it costs.
    pub fn apply_op_with_cost(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        cost: u64,
    ) -> Result<SmallVec<[TensorId; 2]>> {
        self.apply_op_costed(op, inputs, Some(cost))
    }

    fn apply_op_costed(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        cost: Option<u64>,
    ) -> Result<SmallVec<[TensorId; 2]>> {
        // The marks are for this op only, whether or not it runs.
        let lasting = std::mem::take(&mut self.lasting_next);
        for &t in inputs {
            self.live_tensor(t)?;
        }
        // A replay's ops: the graph keeps the signatures of most.
        let known = match &op {
            Op::Recorded(recorded) => self.graph.recorded_signature(recorded),
            _ => None,
        };
        let mut signature = match known {
            Some(signature) => signature,
            None => {
                let layouts: SmallVec<[&Layout; 4]> = inputs
                    .iter()
                    .map(|&t| &*self.graph.tensors[t].layout)
                    .collect();
                op.signature(&layouts)?
            }
        };
        if let Some(cost) = cost {
            signature.cost = cost;
        }
        if signature.outputs.len() > TensorInfo::MAX_OUTPUTS {
            return Err(Error::InvalidArgument(format!(
                "`{}` has {} outputs; an op may have at most {}",
                op.name(),
                signature.outputs.len(),
                TensorInfo::MAX_OUTPUTS
            )));
        }
        let node = self.insert_node(op, inputs, signature, &lasting);
        self.step_op(node);
        if let Err(error) = self.materialize(node, true) {
            self.remove_failed_node(node);
            return Err(error);
        }
        self.lookahead_op_ran(node);
        let outputs: SmallVec<[TensorId; 2]> = self.graph.nodes[node].live_outputs().collect();
        for &t in &outputs {
            let storage = self.graph.tensors[t].storage;
            self.touch(storage);
        }
        let event = RunEvent::Apply {
            node,
            inputs,
            outputs: &outputs,
        };
        self.observers.notify(&event, &self.graph);
        Ok(outputs)
    }

    /// [`Interpreter::apply_op`] for an op with exactly one output.
    pub fn apply1(&mut self, op: Op, inputs: &[TensorId]) -> Result<TensorId> {
        let name = op.name().to_string();
        let outputs = self.apply_op(op, inputs)?;
        match outputs.as_slice() {
            [one] => Ok(*one),
            _ => {
                // Keep the interpreter clean: the caller gets no handle to these.
                for &t in &outputs {
                    self.del(t)?;
                }
                Err(Error::InvalidArgument(format!(
                    "apply1: `{name}` has {} outputs",
                    outputs.len()
                )))
            }
        }
    }

    /// Reads a tensor back, rematerialising it if needed.
    pub fn get_value(&mut self, tensor: TensorId) -> Result<Vec<f32>> {
        self.ensure_defined(tensor)?;
        self.lookahead_read(tensor);
        let storage = self.graph.tensors[tensor].storage;
        self.touch(storage);
        // Pinned while the data is read back, so nothing can evict it meanwhile.
        self.table.pin(storage);
        let info = &self.graph.tensors[tensor];
        let view = crate::backend::BufferView {
            buffer: self.table.buffer(storage),
            layout: &info.layout,
        };
        let result = self.backend.read(view);
        self.table.unpin(&self.graph, storage);
        self.observe(TensorInstruction::Get, tensor);
        result
    }

    /// Adds a user handle to `tensor` (it then needs one more [`Interpreter::del`]).
    pub fn retain(&mut self, tensor: TensorId) -> Result<()> {
        self.live_tensor(tensor)?;
        self.graph.tensors[tensor].user_refs += 1;
        self.observe(TensorInstruction::Retain, tensor);
        Ok(())
    }

    /// Keeps `tensor` resident until [`Interpreter::unpin`], rematerialising it now if needed.
    pub fn pin(&mut self, tensor: TensorId) -> Result<()> {
        self.ensure_defined(tensor)?;
        self.table.pin(self.graph.tensors[tensor].storage);
        self.observe(TensorInstruction::Pin, tensor);
        Ok(())
    }

    /// Evicts `tensor`'s storage now, as a static schedule would (it comes
    /// back by recomputation, or from host memory, when next needed).
    /// `tensor` may be one whose handles are gone but which is kept as
    /// history. Returns whether it was evicted: pinned, locked and already
    /// evicted storages are not, nor puts and detached tensors without a
    /// host copy.
    pub fn evict_now(&mut self, tensor: TensorId) -> Result<bool> {
        let storage = self
            .graph
            .tensors
            .get(tensor)
            .ok_or_else(|| Error::UnknownTensor(format!("{tensor:?}")))?
            .storage;
        if !self.table.can_evict(&self.graph, storage) {
            return Ok(false);
        }
        self.evict(storage, false, None);
        Ok(true)
    }

    /// Brings `tensor`'s value back into memory if it was evicted, without
    /// reading it (a foreign framework is about to read the buffer itself):
    /// a [`Interpreter::get_value`] whose read is the caller's, observed as one.
    pub fn ensure_resident(&mut self, tensor: TensorId) -> Result<()> {
        self.ensure_defined(tensor)?;
        self.lookahead_read(tensor);
        let storage = self.graph.tensors[tensor].storage;
        self.touch(storage);
        self.observe(TensorInstruction::Get, tensor);
        Ok(())
    }

    /// Prepares for `tensor`'s value to change outside the interpreter (a
    /// foreign framework updating a parameter in place): the nearest tensors
    /// with a user handle whose recomputation would read the old value are
    /// materialised now and [detached](Interpreter::detach), so no history
    /// needs the old value any more. Those computed from them keep their
    /// history, which now starts at a constant (a chain of activations
    /// held while its weight changes stays evictable), unless they are
    /// smaller than it: a recomputable tensor keeps the constants it is
    /// computed from alive, and a loss held to the end would keep a whole
    /// activation. Those are detached too. Returns the tensors it detached.
    pub fn preserve_dependents(&mut self, tensor: TensorId) -> Result<Vec<TensorId>> {
        let storage = self.live_tensor(tensor)?.storage;
        if self.table.host_copy_ready_at(storage).is_some() {
            // The host copy is about to be stale: the value comes back to
            // the device first (a constant may be only on the host).
            self.ensure_defined(tensor)?;
            self.table.drop_host_copy(storage);
            self.table.refresh_candidacy(&self.graph, storage);
        }
        let mut dependents = self.nearest_held_dependents(storage);
        // Detaching one frees only history that no live tensor needs, so
        // the others' histories are intact.
        for &dependent in &dependents {
            self.detach(dependent)?;
            self.backend.made_constant(dependent);
        }
        // Then those below them that are smaller than the one they were
        // reached from: detached, they no longer keep it alive. Detaching
        // more is always safe; this only saves memory.
        let graph = &self.graph;
        let held = |t: TensorId| graph.tensors[t].user_refs > 0;
        let bytes_of = |t: TensorId| graph.storages[graph.tensors[t].storage].bytes;
        let mut visited = SecondaryMap::new();
        let mut smaller = Vec::new();
        for &root in &dependents {
            let readers = graph.tensors[root].consumers.iter(&graph.nodes);
            let below = |t: TensorId| {
                let storage_root = graph.storages[graph.tensors[t].storage].tensors[0] == t;
                held(t) && storage_root && bytes_of(t) < bytes_of(root)
            };
            smaller.extend(first_on_each_path(graph, readers, &mut visited, below));
        }
        for &dependent in &smaller {
            self.detach(dependent)?;
            self.backend.made_constant(dependent);
        }
        dependents.extend(smaller);
        Ok(dependents)
    }

    /// The nearest tensors with a user handle on each path from the ops
    /// that read `storage`.
    fn nearest_held_dependents(&self, storage: StorageId) -> Vec<TensorId> {
        let graph = &self.graph;
        let readers = (graph.storages[storage].tensors.iter())
            .flat_map(|&t| graph.tensors[t].consumers.iter(&graph.nodes));
        let held = |t: TensorId| graph.tensors[t].user_refs > 0;
        first_on_each_path(graph, readers, &mut SecondaryMap::new(), held)
    }

    /// The bytes [`Interpreter::preserve_dependents`] would make
    /// constants of before `tensor` changes (the nearest held tensors
    /// computed from it, which could be evicted until then): what a copy
    /// of its value for the history that reads it
    /// ([`Interpreter::redirect_reads`]) would save when it is smaller.
    pub fn bytes_preserving_dependents(&self, tensor: TensorId) -> Result<u64> {
        let storage = self.live_tensor(tensor)?.storage;
        let graph = &self.graph;
        let bytes = (self.nearest_held_dependents(storage).iter())
            .map(|&t| graph.storages[graph.tensors[t].storage].bytes)
            .sum();
        Ok(bytes)
    }

    /// Before `from` changes in place, the other way to keep its history
    /// whole (see [`Interpreter::preserve_dependents`]): every live op
    /// that reads `from` reads `to` instead, a constant the host has made
    /// with the value `from` holds now. Both must be whole storages (no
    /// views) of the same layout, `from` resident.
    pub fn redirect_reads(&mut self, from: TensorId, to: TensorId) -> Result<()> {
        let (from_storage, to_storage) = (
            self.live_tensor(from)?.storage,
            self.live_tensor(to)?.storage,
        );
        let graph = &self.graph;
        // A view's op reads its base, and must go on reading it.
        let whole = |t: TensorId| graph.storages[graph.tensors[t].storage].tensors[..] == [t];
        if from_storage == to_storage
            || !graph.tensors[from].defined
            || !whole(from)
            || !whole(to)
            || graph.storages[to_storage].recomputable
            || graph.tensors[from].layout != graph.tensors[to].layout
        {
            return Err(Error::InvalidArgument(format!(
                "redirect_reads: {to:?} must be a constant of resident {from:?}'s layout, both storages without views"
            )));
        }
        let readers: Vec<NodeId> = graph.tensors[from].consumers.iter(&graph.nodes).collect();
        // Told while the graph still has the old edges: the storages on
        // both ends of each.
        let mut changed: Vec<StorageId> = vec![from_storage, to_storage];
        for &node in &readers {
            let outputs = graph.nodes[node].live_outputs();
            changed.extend(outputs.map(|t| graph.tensors[t].storage));
        }
        for storage in changed {
            self.heuristic.on_graph_change(storage, &self.graph);
        }
        for &node in &readers {
            self.graph.nodes[node].replace_input(from, to);
            if !(self.graph.tensors[to].consumers.iter(&self.graph.nodes)).any(|n| n == node) {
                self.graph.tensors[to].consumers.push(node);
            }
        }
        self.graph.tensors[from].consumers.clear();
        // Kept only as history, it is history no more.
        if self.graph.tensors[from].user_refs == 0 {
            self.free(from);
        }
        Ok(())
    }

    /// Undoes one [`Interpreter::pin`].
    pub fn unpin(&mut self, tensor: TensorId) -> Result<()> {
        let storage = self.live_tensor(tensor)?.storage;
        if !self.table.is_pinned(storage) {
            return Err(Error::InvalidArgument(format!(
                "unpin: tensor {tensor:?} is not pinned"
            )));
        }
        self.table.unpin(&self.graph, storage);
        self.observe(TensorInstruction::Unpin, tensor);
        Ok(())
    }

    /// Changes the budget. Lowering it below what is in use takes effect at
    /// the next allocation, which evicts down to it.
    pub fn set_budget_bytes(&mut self, budget_bytes: Option<u64>) {
        self.table.set_budget_bytes(budget_bytes);
        self.config.budget = budget_bytes.into();
        self.drop_step_plan();
    }

    /// The shape of a tensor the user holds.
    pub fn dims(&self, tensor: TensorId) -> Result<&[usize]> {
        Ok(&self.live_tensor(tensor)?.layout.dims)
    }

    /// Whether the tensor's value is in memory now (no recomputation needed).
    pub fn is_resident(&self, tensor: TensorId) -> Result<bool> {
        Ok(self.live_tensor(tensor)?.defined)
    }

    /// Whether the tensor views another tensor's storage (and so cannot be
    /// [detached](Interpreter::detach) itself).
    pub fn is_view(&self, tensor: TensorId) -> Result<bool> {
        let storage = self.live_tensor(tensor)?.storage;
        Ok(self.graph.storages[storage].tensors[0] != tensor)
    }

    /// Memory in use, its peak and the budget now.
    pub fn memory(&self) -> MemoryReport {
        let counter = self.table.counter();
        let (host_bytes, host_peak_bytes) = self.table.host_bytes();
        MemoryReport {
            host_bytes,
            host_peak_bytes,
            in_use_bytes: counter.in_use_bytes(),
            peak_bytes: counter.peak_bytes(),
            budget_bytes: counter.budget_bytes(),
            constant_peak_bytes: self.table.constant_peak_bytes(),
            arena: self.table.memory().arena().map(|arena| arena.report()),
        }
    }

    /// The configuration, with a ratio budget resolved to bytes.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the run has done so far.
    pub fn stats(&self) -> &Stats {
        &self.observers.stats
    }

    /// Recorded events (empty unless [`Config::record_events`]).
    pub fn events(&self) -> &[Event] {
        self.observers.log.as_ref().map_or(&[], |log| &log.0)
    }

    /// Tensors the interpreter still tracks, as handles or as history.
    pub fn tracked_tensors(&self) -> usize {
        self.graph.tensors.len()
    }

    /// Storages still tracked, resident or evicted.
    pub fn tracked_storages(&self) -> usize {
        self.graph.storages.len()
    }

    /// Read-only access to the tables, for inspection and heuristics' tests.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The eviction heuristic's name.
    pub fn heuristic_name(&self) -> &'static str {
        self.heuristic_name
    }

    /// The backend the ops run on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, to hand it what it needs between instructions (a foreign
    /// backend's results of an op it has already run, say).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Starts passing every event of the run to `observer` (a
    /// [`crate::trace::recorder::TraceRecorder`], say), replacing the one
    /// installed before.
    pub fn set_observer(&mut self, observer: Box<dyn Observer>) {
        self.observers.user = Some(observer);
    }

    /// Stops observing: the observer flushes and reports its errors.
    pub fn finish_observer(&mut self) -> std::io::Result<()> {
        match self.observers.user.take() {
            Some(mut observer) => observer.finish(),
            None => Ok(()),
        }
    }

    fn observe(&mut self, instruction: TensorInstruction, tensor: TensorId) {
        let event = RunEvent::Instruction {
            instruction,
            tensor,
        };
        self.observers.notify(&event, &self.graph);
    }

    /// A tensor the user still holds a handle to.
    fn live_tensor(&self, tensor: TensorId) -> Result<&TensorInfo> {
        match self.graph.tensors.get(tensor) {
            Some(info) if info.user_refs > 0 => Ok(info),
            Some(_) => Err(Error::UnknownTensor(format!("{tensor:?} (deleted)"))),
            None => Err(Error::UnknownTensor(format!("{tensor:?}"))),
        }
    }

    /// Makes a live tensor's value available, recomputing what it needs.
    fn ensure_defined(&mut self, tensor: TensorId) -> Result<()> {
        let info = self.live_tensor(tensor)?;
        if info.defined {
            let storage = info.storage;
            self.await_arrival(storage);
            return Ok(());
        }
        let storage = info.storage;
        if !self.graph.storages[storage].is_resident() && self.restores_from_host(storage) {
            self.swap_in(storage)?;
        }
        let info = &self.graph.tensors[tensor];
        if info.defined {
            return Ok(());
        }
        let node = info
            .producer
            .expect("only recomputable storages are evicted");
        self.materialize(node, false)
    }

    /// Adds a node and its (not yet computed) outputs to the graph;
    /// `lasting[k]` marks output `k` as one the program keeps.
    fn insert_node(
        &mut self,
        op: Op,
        inputs: &[TensorId],
        signature: crate::ops::Signature,
        lasting: &[bool],
    ) -> NodeId {
        let applied = self.graph.applied(op, signature);
        let outputs = applied.signature.outputs.clone();
        let node = self.graph.nodes.insert(OpNode::new(applied, inputs));
        for (k, spec) in outputs.iter().enumerate() {
            let bytes = spec.bytes();
            let storage = match spec.alias_of {
                Some(i) => self.graph.tensors[inputs[i]].storage,
                None => {
                    let storage = self.new_storage(bytes, true);
                    self.graph.storages[storage].lasting = lasting.get(k).copied().unwrap_or(false);
                    storage
                }
            };
            let layout = self.graph.layout(&spec.layout);
            let tensor = self.graph.tensors.insert(TensorInfo {
                producer: Some(node),
                output: k as u16,
                storage,
                layout,
                defined: false,
                user_refs: 1,
                consumers: Consumers::default(),
            });
            self.graph.storages[storage].tensors.push(tensor);
            self.refresh_storage_cost(storage);
            self.graph.nodes[node].set_output(k, Some(tensor));
        }
        // The node is new, so only a repeated input can list it already.
        for (i, &input) in inputs.iter().enumerate() {
            if !inputs[..i].contains(&input) {
                self.graph.tensors[input].consumers.push(node);
            }
        }
        for k in 0..self.graph.nodes[node].outputs().len() {
            let output = self.graph.nodes[node].output(k).expect("just inserted");
            self.heuristic
                .on_graph_change(self.graph.tensors[output].storage, &self.graph);
        }
        node
    }

    /// Marks `storage` accessed now: its staleness starts again.
    fn touch(&mut self, storage: StorageId) {
        self.graph.storages[storage].last_access = self.graph.clock;
        self.table.refresh_record(&self.graph, storage);
    }

    /// Recomputes `c0` of `storage` after its set of tensors changed. When
    /// swapping, a storage that cannot be recomputed comes back by copy, so
    /// its `c0` is the transfer: the heuristics price it like any other.
    fn refresh_storage_cost(&mut self, storage: StorageId) {
        self.graph.refresh_storage_cost(storage);
        let info = &mut self.graph.storages[storage];
        if !info.recomputable && self.config.restore != crate::config::RestoreMode::Drop {
            info.cost = self.config.swap.transfer_cost(info.bytes);
        }
        self.table.refresh_record(&self.graph, storage);
    }

    /// A storage of `bytes`, not yet resident, known to the graph and the
    /// storage table; its tensors are added by the caller.
    fn new_storage(&mut self, bytes: u64, recomputable: bool) -> StorageId {
        let storage = self.graph.storages.insert(StorageInfo {
            bytes,
            tensors: SmallVec::new(),
            residency: Residency::Pending,
            last_access: self.graph.clock,
            cost: 0,
            recomputable,
            lasting: false,
        });
        self.table.register(storage);
        storage
    }

    /// Undoes [`Interpreter::insert_node`] for a node whose first run failed.
    fn remove_failed_node(&mut self, node: NodeId) {
        for output in self.graph.nodes[node].live_outputs() {
            self.heuristic
                .on_graph_change(self.graph.tensors[output].storage, &self.graph);
        }
        let removed = self.graph.nodes.remove(node).expect("node exists");
        self.backend.forget(removed.op());
        for tensor in removed.live_outputs() {
            let info = self.graph.tensors.remove(tensor).expect("output exists");
            debug_assert!(!info.defined, "a failed op defined an output");
            let storage = &mut self.graph.storages[info.storage];
            storage.tensors.retain(|t| *t != tensor);
            if storage.tensors.is_empty() {
                self.forget_storage(info.storage);
            } else {
                self.refresh_storage_cost(info.storage);
            }
        }
        let inputs = removed.inputs();
        for (i, &input) in inputs.iter().enumerate() {
            if !inputs[..i].contains(&input) {
                let nodes = &self.graph.nodes;
                self.graph.tensors[input].consumers.forget_removed(nodes);
            }
        }
    }
}

impl<B: Backend> Interpreter<B> {
    /// Verifies the interpreter's internal invariants (for tests and
    /// debugging): memory accounting matches the resident storages, the
    /// candidate pool holds exactly the evictable ones, no lock outlives an
    /// op, tensors are defined only over resident storages, and the
    /// consumer lists match the nodes.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let graph = &self.graph;
        for (id, s) in &graph.storages {
            if s.tensors.is_empty() {
                return Err(format!("{id:?} has no tensors"));
            }
        }
        self.table.check(graph)?;
        self.heuristic.check_bounds(self.table.pool(), graph)?;
        for (id, t) in &graph.tensors {
            if t.user_refs == 0 && t.consumers.is_empty() && !self.config.retain_history {
                return Err(format!("{id:?} is unneeded but not freed"));
            }
            for node in t.consumers.iter(&graph.nodes) {
                if !graph.nodes[node].inputs().contains(&id) {
                    return Err(format!(
                        "{id:?} lists {node:?} as consumer but is not its input"
                    ));
                }
            }
        }
        for (id, node) in &graph.nodes {
            if node.outputs().all(|output| output.is_none()) {
                return Err(format!("{id:?} has no live output"));
            }
            for &input in node.inputs() {
                if !graph.tensors[input]
                    .consumers
                    .iter(&graph.nodes)
                    .any(|n| n == id)
                {
                    return Err(format!("{id:?} reads {input:?}, which does not list it"));
                }
            }
        }
        Ok(())
    }
}

/// The tensors that `stop` picks among the outputs of `readers` and of the
/// nodes downstream of them, each the first so picked on its path: the
/// walk goes on only through outputs not picked. Nodes in `visited` are
/// passed over (and every node walked is added).
fn first_on_each_path(
    graph: &Graph,
    readers: impl Iterator<Item = NodeId>,
    visited: &mut SecondaryMap<NodeId, ()>,
    stop: impl Fn(TensorId) -> bool,
) -> Vec<TensorId> {
    let mut stack: Vec<NodeId> = readers.collect();
    let mut found = Vec::new();
    while let Some(node) = stack.pop() {
        if visited.insert(node, ()).is_some() {
            continue;
        }
        for output in graph.nodes[node].live_outputs() {
            if stop(output) {
                found.push(output);
            } else {
                stack.extend(graph.tensors[output].consumers.iter(&graph.nodes));
            }
        }
    }
    found
}
