//! Watching a run. Everything that follows what an interpreter does — its
//! counters ([`Stats`]), the event log behind timelines ([`EventLog`]), the
//! `tracing` output ([`TracingLog`]) and trace recording
//! ([`crate::trace::recorder::TraceRecorder`]) — is an [`Observer`] of one
//! stream of [`RunEvent`]s, told in the order things happen.

use crate::error::Error;
use crate::graph::{Graph, NodeId, StorageId, TensorId};

use super::stats::{Event, Stats};

/// An instruction on one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorInstruction {
    /// Another handle to the tensor (`retain`).
    Retain,
    /// A handle dropped (`del`).
    Del,
    /// The tensor's value read (`get_value`).
    Get,
    /// The tensor's storage made unevictable.
    Pin,
    /// One pin released.
    Unpin,
    /// The tensor's compute history cut.
    Detach,
}

/// One thing that happened in a run. Ids refer to the graph handed beside
/// the event, where observers look up what they need (op names, sizes).
#[derive(Debug, Clone, Copy)]
pub enum RunEvent<'a> {
    /// The program put a tensor.
    Put {
        /// The new tensor.
        tensor: TensorId,
        /// Bytes it takes.
        bytes: u64,
        /// Its shape; empty for an opaque put, whose values are unknown.
        dims: &'a [usize],
        /// Its values, when known.
        data: Option<&'a [f32]>,
    },
    /// The program applied `node`'s op; it ran and its outputs are defined.
    Apply {
        /// The op's node in the graph.
        node: NodeId,
        /// The tensors it read.
        inputs: &'a [TensorId],
        /// The handles it returned, one per output.
        outputs: &'a [TensorId],
    },
    /// The program gave an instruction on one tensor, which succeeded.
    Instruction {
        /// Which instruction.
        instruction: TensorInstruction,
        /// The tensor it named.
        tensor: TensorId,
    },
    /// The backend ran `node`'s op.
    Ran {
        /// The op's node in the graph.
        node: NodeId,
        /// What running it cost (cost units).
        cost: u64,
        /// Run again to restore an evicted tensor, not for the program.
        rematerializing: bool,
        /// The first evicted tensor it restored, if any.
        restored: Option<TensorId>,
    },
    /// A storage was evicted.
    Evicted {
        /// The storage (still in the graph, no longer resident).
        storage: StorageId,
        /// Bytes freed.
        bytes: u64,
        /// The victim's score, when a policy with scores chose it.
        score: Option<f64>,
        /// Evicted because its handles were dropped, not to make room.
        eager: bool,
        /// It can come back from a host copy instead of being recomputed.
        to_host: bool,
    },
    /// An op got room only by unlocking inputs of pending
    /// rematerialisations (see [`crate::Config::lock_relaxation`]).
    LocksRelaxed {
        /// The op that needed the room.
        node: NodeId,
        /// How many locked inputs were given up.
        surrendered: usize,
    },
    /// An op that fragmentation left without room is tried again with its
    /// outputs' blocks reserved before its inputs are restored.
    OutputsReservedFirst {
        /// The op.
        node: NodeId,
    },
    /// A copy of a storage was written to host memory.
    HostCopied {
        /// The storage copied.
        storage: StorageId,
        /// Its size.
        bytes: u64,
    },
    /// An evicted storage came back from its host copy.
    SwappedIn {
        /// The storage restored.
        storage: StorageId,
        /// Its size.
        bytes: u64,
    },
    /// A transfer began copying an evicted storage back from its host copy
    /// ahead of need, into free memory; its bytes are reserved from now
    /// and its tensors usable once the transfer ends.
    Prefetched {
        /// The storage coming back.
        storage: StorageId,
        /// Its size.
        bytes: u64,
        /// When the transfer ends (on the interpreter's clock).
        arrives_at: u64,
    },
    /// Compute waited for the copy queue.
    Stalled {
        /// How long (cost units).
        cost: u64,
    },
    /// A compacting arena moved blocks to make room for an allocation.
    Moved {
        /// Bytes copied.
        bytes: u64,
        /// How long the copies took (cost units).
        cost: u64,
    },
    /// The budget has cost more than the thrash limit; the instruction
    /// fails.
    Thrashing {
        /// Recomputation, swap stalls and moves so far (cost units).
        budget_cost: u64,
        /// The limit ([`crate::Config::remat_limit`]).
        limit: u64,
    },
    /// No eviction could make room; the instruction fails.
    OutOfMemory {
        /// The error the instruction returns.
        error: &'a Error,
    },
    /// The program marked the end of a step
    /// ([`crate::Interpreter::mark_step`]).
    StepEnded {
        /// The step followed the previous step's plan to the end: the
        /// policy ran only to repair requests the plan left short.
        followed: bool,
        /// Requests of a followed step the policy repaired.
        repairs: u32,
    },
}

/// Follows a run's events. Install one with
/// [`crate::Interpreter::set_observer`].
pub trait Observer: Send {
    /// `event` happened; `graph` is the interpreter's state just after.
    fn observe(&mut self, event: &RunEvent<'_>, graph: &Graph);

    /// The run is over: flush, and report any error met on the way.
    fn finish(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A shared observer, so its owner can read it while the interpreter runs.
impl<T: Observer> Observer for std::sync::Arc<std::sync::Mutex<T>> {
    fn observe(&mut self, event: &RunEvent<'_>, graph: &Graph) {
        // A poisoned lock only means another holder panicked; keep observing.
        let mut inner = self.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.observe(event, graph);
    }

    fn finish(&mut self) -> std::io::Result<()> {
        let mut inner = self.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.finish()
    }
}

impl Observer for Stats {
    fn observe(&mut self, event: &RunEvent<'_>, graph: &Graph) {
        let add = |counter: &mut u64, value: u64| *counter = counter.saturating_add(value);
        match *event {
            RunEvent::Apply { node, .. } => {
                self.ops += 1;
                add(&mut self.baseline_compute, graph.nodes[node].cost());
            }
            RunEvent::Ran {
                cost,
                rematerializing,
                ..
            } => {
                add(&mut self.compute, cost);
                if rematerializing {
                    add(&mut self.remat_compute, cost);
                    self.rematerializations += 1;
                }
            }
            RunEvent::Evicted { eager, to_host, .. } => {
                self.evictions += 1;
                self.eager_evictions += u64::from(eager);
                self.swap_outs += u64::from(to_host);
            }
            RunEvent::LocksRelaxed { .. } => self.lock_relaxations += 1,
            RunEvent::OutputsReservedFirst { .. } => self.outputs_reserved_first += 1,
            RunEvent::HostCopied { .. } => self.host_copies += 1,
            RunEvent::SwappedIn { .. } => self.swap_ins += 1,
            RunEvent::Prefetched { .. } => self.prefetches += 1,
            RunEvent::Stalled { cost } => add(&mut self.swap_stall, cost),
            RunEvent::Moved { bytes, cost } => {
                self.compactions += 1;
                add(&mut self.moved_bytes, bytes);
                add(&mut self.move_cost, cost);
            }
            RunEvent::StepEnded { followed, repairs } => {
                self.steps += 1;
                self.planned_steps += u64::from(followed);
                self.plan_repairs += u64::from(repairs);
            }
            RunEvent::Put { .. }
            | RunEvent::Instruction { .. }
            | RunEvent::Thrashing { .. }
            | RunEvent::OutOfMemory { .. } => {}
        }
    }
}

/// The evictions and rematerialisations of a run, in order (kept when
/// [`crate::Config::record_events`] is on; read with
/// [`crate::Interpreter::events`]).
#[derive(Debug, Clone, Default)]
pub struct EventLog(pub Vec<Event>);

impl Observer for EventLog {
    fn observe(&mut self, event: &RunEvent<'_>, graph: &Graph) {
        match *event {
            RunEvent::Evicted {
                storage,
                bytes,
                score,
                eager,
                ..
            } => self.0.push(Event::Evict {
                tensor: graph.storages[storage].tensors[0],
                bytes,
                eager,
                score,
            }),
            RunEvent::Ran {
                node,
                rematerializing: true,
                restored: Some(tensor),
                ..
            } => self.0.push(Event::Rematerialize {
                tensor,
                op: graph.nodes[node].op().name().to_string(),
            }),
            _ => {}
        }
    }
}

/// Reports the runtime's decisions as `tracing` events: evictions and
/// rematerialisations at debug level under `dtr::evict`, `dtr::remat` and
/// `dtr::swap`, thrashing and out-of-memory as warnings. Costs nothing
/// beyond a level check when no subscriber listens.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLog;

impl Observer for TracingLog {
    fn observe(&mut self, event: &RunEvent<'_>, graph: &Graph) {
        use tracing::{debug, enabled, warn, Level};
        let op_name = |node: NodeId| graph.nodes[node].op().name();
        match *event {
            RunEvent::Evicted {
                storage,
                bytes,
                score,
                eager,
                to_host,
            } if enabled!(target: "dtr::evict", Level::DEBUG) => {
                let info = &graph.storages[storage];
                let root = info.tensors[0];
                let op = graph.tensors[root].producer.map_or("put", op_name);
                let held = info.tensors.iter().any(|&t| graph.tensors[t].user_refs > 0);
                let staleness = graph.staleness(storage);
                debug!(target: "dtr::evict", tensor = ?root, op, bytes, ?score, eager, to_host, held, staleness, clock = graph.clock, "evicted");
            }
            RunEvent::Ran {
                node,
                cost,
                rematerializing: true,
                restored: Some(tensor),
            } => {
                debug!(target: "dtr::remat", op = op_name(node), ?tensor, cost, clock = graph.clock, "rematerialized");
            }
            RunEvent::LocksRelaxed { node, surrendered } => {
                debug!(target: "dtr::remat", op = op_name(node), surrendered, "relaxing the locks of pending rematerialisations");
            }
            RunEvent::OutputsReservedFirst { node } => {
                debug!(target: "dtr::remat", op = op_name(node), "fragmented: reserving its outputs before restoring its inputs");
            }
            RunEvent::SwappedIn { storage, bytes } => {
                let tensor = graph.storages[storage].tensors[0];
                debug!(target: "dtr::swap", ?tensor, bytes, clock = graph.clock, "swapped in");
            }
            RunEvent::Prefetched {
                storage,
                bytes,
                arrives_at,
            } => {
                let tensor = graph.storages[storage].tensors[0];
                debug!(target: "dtr::swap", ?tensor, bytes, clock = graph.clock, arrives_at, "prefetching");
            }
            RunEvent::Thrashing { budget_cost, limit } => {
                warn!(target: "dtr::thrash", budget_cost, limit, "thrashing")
            }
            RunEvent::Moved { bytes, cost } => {
                debug!(target: "dtr::compact", bytes, cost, clock = graph.clock, "moved blocks to make room");
            }
            RunEvent::OutOfMemory { error } => warn!(target: "dtr::oom", %error),
            _ => {}
        }
    }
}

/// Who watches one interpreter: its counters and `tracing` always, its
/// event log when asked for, and one observer of the user's.
#[derive(Default)]
pub(super) struct Observers {
    pub stats: Stats,
    pub log: Option<EventLog>,
    pub user: Option<Box<dyn Observer>>,
}

impl Observers {
    pub fn notify(&mut self, event: &RunEvent<'_>, graph: &Graph) {
        self.stats.observe(event, graph);
        // Its messages are at DEBUG and WARN: one load of the subscribers'
        // most verbose level skips it when none takes them (the default).
        if tracing::level_enabled!(tracing::Level::WARN) {
            TracingLog.observe(event, graph);
        }
        if let Some(log) = &mut self.log {
            log.observe(event, graph);
        }
        if let Some(user) = &mut self.user {
            user.observe(event, graph);
        }
    }
}
