//! The interpreter's tables: tensors, the storages behind them, and the op
//! applications (compute paths) that made them. Heuristics read these
//! through `&Graph`; only the interpreter changes them.

use std::sync::Arc;

use slotmap::{new_key_type, Key, SecondaryMap, SlotMap};
use smallvec::SmallVec;

use crate::intern::{Interner, Sweeps};
use crate::ops::{Op, Outputs, OutputsInterner, RecordedOp, RecordedOutput, Signature};
use crate::shape::Layout;

new_key_type! {
    /// A tensor as the user and the compute history name it.
    pub struct TensorId;
    /// The memory behind one tensor and the views of it.
    pub struct StorageId;
    /// One application of an op: the compute path of its outputs.
    pub struct NodeId;
}

/// An op and its checked signature: what every application of the op to
/// inputs of the same layouts shares. The graph holds each distinct one
/// once (see `Graph::applied`): a replay's million `layer` nodes point at
/// one copy, which keeps a node to its inputs and outputs.
#[derive(Debug, PartialEq)]
pub struct AppliedOp {
    /// The op, as the backend runs it.
    pub op: Op,
    /// Its checked outputs and its recompute cost.
    pub signature: Signature,
}

// Ops compare their float attributes (`Fill`, `Scalar`, `LayerNorm`) by
// value, so one holding a NaN equals no op, itself included: it is never
// found in the interner and just gets a copy of its own. Nothing else
// depends on reflexivity.
impl Eq for AppliedOp {}

impl std::hash::Hash for AppliedOp {
    /// A cheap digest of what [`PartialEq`] compares: equal applied ops
    /// have equal names, costs and output counts.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.op.name().hash(state);
        self.signature.cost.hash(state);
        self.signature.outputs.len().hash(state);
    }
}

/// One op application; all of its outputs are (re)computed together.
#[derive(Debug, Clone)]
pub struct OpNode {
    /// The op and its signature, shared with the nodes of equal ones.
    pub applied: Arc<AppliedOp>,
    /// Its inputs, then one entry per output of the signature: three
    /// inline, as most ops read one or two tensors and make one. A freed
    /// output is the null key (it is still produced, then dropped).
    tensors: SmallVec<[TensorId; 3]>,
}

impl OpNode {
    /// A node reading `inputs`, its outputs not made yet.
    pub(crate) fn new(applied: Arc<AppliedOp>, inputs: &[TensorId]) -> OpNode {
        let count = inputs.len() + applied.signature.outputs.len();
        let mut tensors = SmallVec::with_capacity(count);
        tensors.extend_from_slice(inputs);
        tensors.resize(count, TensorId::null());
        OpNode { applied, tensors }
    }

    /// Where the outputs start in `tensors`.
    fn first_output(&self) -> usize {
        self.tensors.len() - self.applied.signature.outputs.len()
    }

    /// The tensors it reads, in order (a tensor read twice is listed twice).
    pub fn inputs(&self) -> &[TensorId] {
        &self.tensors[..self.first_output()]
    }

    /// Each output in order: `None` once it has been freed, or before it
    /// was made.
    pub fn outputs(&self) -> impl ExactSizeIterator<Item = Option<TensorId>> + '_ {
        self.tensors[self.first_output()..]
            .iter()
            .map(|&t| (!t.is_null()).then_some(t))
    }

    /// The outputs not freed, in order.
    pub fn live_outputs(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.outputs().flatten()
    }

    /// Reads `to` wherever it read `from`.
    pub(crate) fn replace_input(&mut self, from: TensorId, to: TensorId) {
        let first_output = self.first_output();
        for input in &mut self.tensors[..first_output] {
            if *input == from {
                *input = to;
            }
        }
    }

    /// Output `k`: `None` when freed, not made yet, or past the last.
    pub fn output(&self, k: usize) -> Option<TensorId> {
        let t = *self.tensors.get(self.first_output() + k)?;
        (!t.is_null()).then_some(t)
    }

    /// Sets output `k` (`None`: freed).
    pub(crate) fn set_output(&mut self, k: usize, tensor: Option<TensorId>) {
        let at = self.first_output() + k;
        self.tensors[at] = tensor.unwrap_or_else(TensorId::null);
    }

    /// The op, as the backend runs it.
    pub fn op(&self) -> &Op {
        &self.applied.op
    }

    /// Its checked outputs and its recompute cost.
    pub fn signature(&self) -> &Signature {
        &self.applied.signature
    }

    /// What running it (again) costs, in cost units.
    pub fn cost(&self) -> u64 {
        self.applied.signature.cost
    }
}

/// Everything the runtime knows about one tensor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// The compute path: the node that made this tensor. `None` for puts,
    /// which can never be recomputed.
    pub producer: Option<NodeId>,
    /// Which of its producer's outputs it is (0 for puts). Two bytes, beside
    /// `defined`, keep the record at 64 B: an op has at most
    /// [`TensorInfo::MAX_OUTPUTS`] outputs.
    pub output: u16,
    /// The storage holding its bytes (shared with its views).
    pub storage: StorageId,
    /// Shared with every tensor of an equal layout (interned by the graph).
    pub layout: Arc<Layout>,
    /// Whether the value is available now. A view is undefined while its
    /// storage is evicted, and again until its own (cheap) op is replayed.
    pub defined: bool,
    /// Handles the user holds; 0 means the tensor is kept only as history.
    pub user_refs: u32,
    /// Live nodes that read this tensor (each listed once).
    pub consumers: Consumers,
}

impl TensorInfo {
    /// The most outputs one op may have (see [`TensorInfo::output`]).
    pub const MAX_OUTPUTS: usize = u16::MAX as usize + 1;
}

/// The live nodes that read one tensor, each once, in the order they were
/// added. Removal is lazy: a removed node stays listed (its key is dead in
/// [`Graph::nodes`], and slot map keys are never reused) until dead entries
/// are half the list, which is then compacted. A tensor read by n nodes that
/// are all removed costs O(n) in all, not O(n²), and the order of the live
/// ones (which heuristics see) is what eager removal would leave.
#[derive(Debug, Clone, Default)]
pub struct Consumers {
    list: SmallVec<[NodeId; 2]>,
    /// Entries of `list` whose node has been removed.
    dead: u32,
}

impl Consumers {
    /// Whether no live node reads the tensor.
    pub fn is_empty(&self) -> bool {
        self.list.len() == self.dead as usize
    }

    /// The live consumers, given the graph's nodes.
    pub fn iter<'a>(
        &'a self,
        nodes: &'a SlotMap<NodeId, OpNode>,
    ) -> impl Iterator<Item = NodeId> + 'a {
        self.list
            .iter()
            .copied()
            .filter(move |&node| nodes.contains_key(node))
    }

    /// Adds `node`, which must not be listed yet.
    pub(crate) fn push(&mut self, node: NodeId) {
        self.list.push(node);
    }

    /// Lists no node (they read another tensor now).
    pub(crate) fn clear(&mut self) {
        *self = Consumers::default();
    }

    /// Notes that one listed node has been removed from `nodes` (call once
    /// per removed consumer).
    pub(crate) fn forget_removed(&mut self, nodes: &SlotMap<NodeId, OpNode>) {
        self.dead += 1;
        if 2 * self.dead as usize >= self.list.len() {
            self.list.retain(|node| nodes.contains_key(*node));
            self.dead = 0;
        }
    }
}

/// Where a storage stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// In memory.
    Resident,
    /// Freed, with its compute path kept to recompute it (or, for a storage
    /// that is not recomputable, a host copy to bring it back from).
    Evicted,
    /// Output of an op that has not run yet: neither in memory nor
    /// recomputable history, so eviction heuristics do not see it.
    Pending,
}

/// Memory shared by a tensor and its views; the unit of eviction.
#[derive(Debug, Clone)]
pub struct StorageInfo {
    /// Bytes it takes when resident.
    pub bytes: u64,
    /// Tensors viewing this storage; `tensors[0]` is the root, whose op allocates it.
    pub tensors: SmallVec<[TensorId; 2]>,
    /// Written only by the interpreter's storage table; read by heuristics.
    pub residency: Residency,
    /// Logical clock of the last access.
    pub last_access: u64,
    /// `c0`: the summed cost of the distinct ops that produced its tensors.
    pub cost: u64,
    /// False for puts and detached tensors: never recomputed, and evicted
    /// only by swapping, from a host copy (`RestoreMode::Swap`, `Hybrid`).
    pub recomputable: bool,
    /// The program keeps it (a replay knows): it will detach it (a
    /// gradient the optimiser keeps), after which no eviction can free it,
    /// or hold it to its end (an output of a recorded step), when an
    /// eviction costs its history, which by then is gone. An arena places
    /// it apart from the storages that come and go (see
    /// [`Interpreter::expect_lasting_outputs`](crate::Interpreter::expect_lasting_outputs)).
    pub lasting: bool,
}

impl StorageInfo {
    /// Whether its bytes are in memory now.
    pub fn is_resident(&self) -> bool {
        self.residency == Residency::Resident
    }

    /// Whether it was evicted (and can be recomputed or copied back).
    pub fn is_evicted(&self) -> bool {
        self.residency == Residency::Evicted
    }
}

/// The interpreter's tables and logical clock.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every tracked tensor, held by the user or kept as history.
    pub tensors: SlotMap<TensorId, TensorInfo>,
    /// Every tracked storage, resident or evicted.
    pub storages: SlotMap<StorageId, StorageInfo>,
    /// Every op application some tracked tensor may need.
    pub nodes: SlotMap<NodeId, OpNode>,
    /// The sum of the cost of every op run so far (rematerialisations
    /// included), starting at 1.
    pub clock: u64,
    /// The distinct outputs of the nodes' signatures, shared among their
    /// applied ops.
    interned_outputs: OutputsInterner,
    /// The distinct applied ops of the nodes, shared among them.
    interned_applied: Interner<AppliedOp>,
    /// The distinct layouts of the tensors, shared among them.
    interned_layouts: Interner<Layout>,
    /// The interned outputs of recorded ops that view no input, by their
    /// recorded list: a replay's thousands of ops have a few distinct lists.
    recorded_outputs: RecordedOutputs,
    /// When the program will next read each tensor, where a replay knows it.
    pub foresight: Foresight,
}

/// When the program will next read each tensor (an op's input, a get or a
/// pin), in the program's own time (its ops' summed costs, recomputations
/// not counted), as a replay of a recorded trace knows it; for heuristics
/// that look ahead.
#[derive(Debug, Default)]
pub struct Foresight {
    /// Whether a replay, or the step before, tells it (else every tensor's
    /// next read is unknown).
    pub known: bool,
    /// The program's time now.
    pub now: u64,
    /// Each tensor's next read; a tensor not here is not read again. Change
    /// it through [`Graph::set_next_read`], or just after
    /// [`Graph::forget_next_reads`].
    pub next_read: SecondaryMap<TensorId, u64>,
    /// Changes whenever the next read of a tensor whose storage is not
    /// resident does (or every tensor's does): what was found about when
    /// evicted storages are read stays true while it stays the same.
    pub evicted_reads_changed: u64,
}

/// See [`Graph::recorded_signature`].
#[derive(Debug, Default)]
struct RecordedOutputs {
    built: std::collections::HashMap<Arc<[RecordedOutput]>, Outputs, foldhash::fast::RandomState>,
    /// Drops the lists only this table still holds.
    sweeps: Sweeps,
}

impl Graph {
    /// Empty tables, the clock at 1.
    pub fn new() -> Graph {
        Graph {
            clock: 1,
            ..Graph::default()
        }
    }

    /// The shared copy of `layout`, for a new tensor.
    pub(crate) fn layout(&mut self, layout: &Layout) -> Arc<Layout> {
        self.interned_layouts
            .get(layout, || Arc::new(layout.clone()))
    }

    /// `recorded`'s signature when none of its outputs views an input (it
    /// then depends on nothing else), its outputs built and interned once
    /// per distinct recorded list instead of once per op; `None` for an op
    /// with views, whose outputs take their inputs' layouts.
    pub(crate) fn recorded_signature(&mut self, recorded: &RecordedOp) -> Option<Signature> {
        if recorded
            .outputs
            .iter()
            .any(|output| output.alias_of.is_some())
        {
            return None;
        }
        let table = &mut self.recorded_outputs;
        let outputs = match table.built.get(&*recorded.outputs) {
            Some(outputs) => outputs.clone(),
            None => {
                let lists = &mut table.built;
                table.sweeps.before_insert(lists.len(), || {
                    lists.retain(|list, _| Arc::strong_count(list) > 1);
                    lists.len()
                });
                let made = crate::ops::recorded_outputs(recorded, &[])
                    .expect("an output that views no input always checks");
                let outputs = self.interned_outputs.intern(made);
                table
                    .built
                    .insert(recorded.outputs.clone(), outputs.clone());
                outputs
            }
        };
        Some(Signature {
            outputs,
            cost: recorded.cost,
        })
    }

    /// The shared copy of `op` with `signature`, for a new node. A new
    /// one shares its outputs with the applied ops that have equal ones
    /// (looked up only then: most ops repeat an applied op already held).
    pub(crate) fn applied(&mut self, op: Op, signature: Signature) -> Arc<AppliedOp> {
        let applied = AppliedOp { op, signature };
        if let Some(held) = self.interned_applied.find(&applied) {
            return held;
        }
        let AppliedOp { op, mut signature } = applied;
        // Sharing the outputs does not change what the applied op equals.
        signature.outputs = self.interned_outputs.intern(signature.outputs);
        self.interned_applied
            .insert(Arc::new(AppliedOp { op, signature }))
    }

    /// How long until the program next reads one of `storage`'s tensors,
    /// in the program's time (see [`Foresight`]); `None` when it never does
    /// or no replay said.
    pub fn until_next_read(&self, storage: StorageId) -> Option<u64> {
        self.next_read(storage)
            .map(|at| at.saturating_sub(self.foresight.now))
    }

    /// Sets when the program next reads `tensor` (`None`: never again).
    pub(crate) fn set_next_read(&mut self, tensor: TensorId, at: Option<u64>) {
        let foresight = &mut self.foresight;
        let changed = match at {
            Some(at) => foresight.next_read.insert(tensor, at) != Some(at),
            None => foresight.next_read.remove(tensor).is_some(),
        };
        let resident =
            (self.tensors.get(tensor)).is_some_and(|t| self.storages[t.storage].is_resident());
        if changed && !resident {
            foresight.evicted_reads_changed += 1;
        }
    }

    /// Forgets every tensor's next read.
    pub(crate) fn forget_next_reads(&mut self) {
        self.foresight.next_read.clear();
        self.foresight.evicted_reads_changed += 1;
    }

    /// When, in the program's time, it next reads one of `storage`'s
    /// tensors; `None` when it never does or no replay said.
    pub fn next_read(&self, storage: StorageId) -> Option<u64> {
        let foresight = &self.foresight;
        (self.storages[storage].tensors.iter())
            .filter_map(|&t| foresight.next_read.get(t).copied())
            .min()
    }

    /// `clock − last_access`.
    pub fn staleness(&self, storage: StorageId) -> u64 {
        self.clock
            .saturating_sub(self.storages[storage].last_access)
    }

    /// The distinct evicted storages adjacent to `storage`: those of the
    /// inputs of the ops that made its tensors (parents) and of the outputs
    /// of the live ops that read them (children).
    pub fn evicted_neighbours(&self, storage: StorageId) -> SmallVec<[StorageId; 8]> {
        let mut found: SmallVec<[StorageId; 8]> = SmallVec::new();
        self.for_each_neighbour(storage, |s| {
            if self.storages[s].is_evicted() && !found.contains(&s) {
                found.push(s);
            }
        });
        found
    }

    /// Calls `visit` with the storage of every input of the ops that made
    /// `storage`'s tensors and of every output of the live ops that read
    /// them, in that order, other than `storage` itself; a storage met
    /// through several edges is visited once per edge.
    pub fn for_each_neighbour(&self, storage: StorageId, mut visit: impl FnMut(StorageId)) {
        for &t in &self.storages[storage].tensors {
            let info = &self.tensors[t];
            if let Some(node) = info.producer {
                for &input in self.nodes[node].inputs() {
                    let s = self.tensors[input].storage;
                    if s != storage {
                        visit(s);
                    }
                }
            }
            for node in info.consumers.iter(&self.nodes) {
                for output in self.nodes[node].live_outputs() {
                    let s = self.tensors[output].storage;
                    if s != storage {
                        visit(s);
                    }
                }
            }
        }
    }

    /// Recomputes `c0` of a storage after its set of tensors changed.
    pub(crate) fn refresh_storage_cost(&mut self, storage: StorageId) {
        let mut seen: SmallVec<[NodeId; 4]> = SmallVec::new();
        let mut cost = 0;
        for &t in &self.storages[storage].tensors {
            if let Some(node) = self.tensors[t].producer {
                if !seen.contains(&node) {
                    seen.push(node);
                    cost = u64::saturating_add(cost, self.nodes[node].cost());
                }
            }
        }
        self.storages[storage].cost = cost;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{TraceEvent, TraceOutput};

    /// The records a replay keeps per tensor and node stay small: at 10⁶
    /// layers every byte here is a megabyte (issue 17's memory target).
    #[test]
    fn records_stay_small() {
        let sizes = [
            ("OpNode", std::mem::size_of::<OpNode>(), 40),
            ("Op", std::mem::size_of::<Op>(), 72),
            ("TensorInfo", std::mem::size_of::<TensorInfo>(), 64),
            ("StorageInfo", std::mem::size_of::<StorageInfo>(), 56),
            ("TraceEvent", std::mem::size_of::<TraceEvent>(), 40),
            ("TraceOutput", std::mem::size_of::<TraceOutput>(), 40),
        ];
        for (name, size, most) in sizes {
            println!("{name}: {size} B");
            assert!(size <= most, "{name} grew to {size} B (at most {most})");
        }
    }
}
