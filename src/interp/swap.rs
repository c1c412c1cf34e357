//! Swap: restoring an evicted storage from a host copy instead of
//! recomputing it (MegEngine's "swap" beside its "drop"; Capuchin chooses
//! between them per tensor). The storage table keeps the copies; this
//! module decides when to make them and when to use them, and keeps the
//! copy queue's time.
//!
//! The time model, in cost units taken as nanoseconds: two copy queues, one
//! each way (GPUs copy both ways at once over full-duplex links), run beside
//! compute; each moves [`SwapConfig::bandwidth`] bytes per second, one
//! transfer at a time.
//! - **Write-back.** While ops run, the queue copies the recomputable
//!   storages they make to host memory, oldest first, as far as its time and
//!   the host memory limit allow. Evicting a storage whose copy is complete
//!   frees its bytes at once, with no stall: that copy overlapped compute.
//! - **Swap-out on demand.** Evicting by swap a storage without a complete
//!   copy waits for the copy to finish (compute cannot reuse the bytes
//!   before): the clock stalls.
//! - **Swap-in.** Bringing a storage back waits for its transfer (after the
//!   one in flight to the device): the clock stalls.
//!
//! Stalls advance the clock and count in the overhead and the thrash limit.
//! Tensors never change in place, so a host copy stays valid while its
//! storage lives and is kept after a swap-in: evicting it again is free.
//!
//! [`SwapConfig::bandwidth`]: crate::SwapConfig::bandwidth

use std::collections::VecDeque;

use super::eviction::RoomFor;
use super::{Interpreter, RunEvent};
use crate::backend::Backend;
use crate::config::RestoreMode;
use crate::error::Result;
use crate::graph::StorageId;

/// The copy engines: when each direction is next free, and the storages
/// waiting to be written back to host memory with the time each was made.
#[derive(Default)]
pub(super) struct CopyQueue {
    to_host_until: u64,
    to_device_until: u64,
    write_back: VecDeque<(StorageId, u64)>,
}

impl<B: Backend> Interpreter<B> {
    fn swapping(&self) -> bool {
        self.config.restore != RestoreMode::Drop
    }

    /// Queues a storage an op just made for write-back, when swapping under
    /// a budget.
    pub(super) fn queue_write_back(&mut self, storage: StorageId) {
        let budgeted = self.table.counter().budget_bytes().is_some();
        if self.swapping() && budgeted && self.graph.storages[storage].recomputable {
            self.copies
                .write_back
                .push_back((storage, self.graph.clock));
        }
    }

    /// Lets the copy queue write storages back until it catches up with the
    /// clock (the last copy may end after it). Storages that are gone, or
    /// that do not fit in host memory, are skipped.
    pub(super) fn write_back(&mut self) {
        if self.copies.write_back.is_empty() {
            return; // not swapping, or nothing made since
        }
        let limit = self.config.swap.host_memory;
        while self.copies.to_host_until < self.graph.clock {
            let Some((storage, made_at)) = self.copies.write_back.pop_front() else {
                break;
            };
            let Some(info) = self.graph.storages.get(storage) else {
                continue;
            };
            if !info.is_resident()
                || !info.recomputable
                || self.table.host_copy_ready_at(storage).is_some()
                || !self.table.host_has_room(&self.graph, storage, limit)
            {
                continue;
            }
            let start = self.copies.to_host_until.max(made_at);
            let end = start.saturating_add(self.config.swap.transfer_cost(info.bytes));
            match self
                .table
                .copy_to_host(&self.graph, storage, &mut self.backend, end)
            {
                Ok(()) => {
                    self.copies.to_host_until = end;
                    let event = RunEvent::HostCopied {
                        storage,
                        bytes: info.bytes,
                    };
                    self.observers.notify(&event, &self.graph);
                }
                Err(error) => {
                    tracing::warn!(target: "dtr::swap", %error, "write-back failed; the storage will be recomputed if evicted");
                }
            }
        }
    }

    /// Prepares to evict `storage`: whether it can then come back from a
    /// host copy. A complete copy costs nothing; otherwise, if swapping
    /// pays (always under `swap`, by the estimates under `hybrid`) and host
    /// memory has room, the clock stalls until its copy is written. A copy
    /// still being written is abandoned if not waited for (its bytes are
    /// about to be reused). Eager evictions (of storages nothing holds)
    /// never wait.
    pub(super) fn swap_out(&mut self, storage: StorageId, eager: bool) -> bool {
        let now = self.graph.clock;
        let ready_at = self.table.host_copy_ready_at(storage);
        if ready_at.is_some_and(|ready| ready <= now) {
            return true;
        }
        let bytes = self.graph.storages[storage].bytes;
        let transfer = self.config.swap.transfer_cost(bytes);
        let room = ready_at.is_some()
            || self
                .table
                .host_has_room(&self.graph, storage, self.config.swap.host_memory);
        let end =
            ready_at.unwrap_or_else(|| now.max(self.copies.to_host_until).saturating_add(transfer));
        let pays = match self.config.restore {
            RestoreMode::Drop => false,
            RestoreMode::Swap => true,
            RestoreMode::Hybrid => {
                (end - now).saturating_add(transfer) < self.recompute_estimate(storage)
            }
        };
        if eager || !pays || !room {
            self.table.drop_host_copy(storage);
            return false;
        }
        if ready_at.is_none() {
            if let Err(error) =
                self.table
                    .copy_to_host(&self.graph, storage, &mut self.backend, end)
            {
                tracing::warn!(target: "dtr::swap", %error, "swap-out failed; dropping instead");
                return false;
            }
            self.copies.to_host_until = end;
            let event = RunEvent::HostCopied { storage, bytes };
            self.observers.notify(&event, &self.graph);
        }
        self.stall_until(end);
        true
    }

    /// Whether evicted `storage` comes back from its host copy (else it is
    /// recomputed): under `hybrid`, when the transfer is estimated cheaper.
    pub(super) fn restores_from_host(&self, storage: StorageId) -> bool {
        if self.table.host_copy_ready_at(storage).is_none() {
            return false;
        }
        match self.config.restore {
            RestoreMode::Drop => false,
            RestoreMode::Swap => true,
            RestoreMode::Hybrid => {
                let bytes = self.graph.storages[storage].bytes;
                self.config.swap.transfer_cost(bytes) <= self.recompute_estimate(storage)
            }
        }
    }

    /// Brings an evicted storage back from its host copy, making room as
    /// for an op's output; its root tensor is defined again (views are
    /// re-made by their ops, as after a recomputation).
    pub(super) fn swap_in(&mut self, storage: StorageId) -> Result<()> {
        let info = &self.graph.storages[storage];
        let (bytes, root) = (info.bytes, info.tensors[0]);
        let (node, _) = self.graph.tensors[root]
            .producer
            .expect("only recomputable storages are evicted");
        let room = RoomFor::Op {
            node,
            rematerializing: true,
        };
        let block = self.reserve(&[bytes], room)?[0];
        let at = self.table.memory().arena().is_some().then_some(block);
        if let Err(error) =
            self.table
                .copy_from_host(&mut self.graph, storage, &mut self.backend, block, at)
        {
            self.table.unreserve(block);
            return Err(error);
        }
        let start = self.graph.clock.max(self.copies.to_device_until);
        let end = start.saturating_add(self.config.swap.transfer_cost(bytes));
        self.copies.to_device_until = end;
        self.stall_until(end);
        self.graph.tensors[root].defined = true;
        self.heuristic.on_rematerialize(storage, &self.graph);
        let event = RunEvent::SwappedIn { storage, bytes };
        self.observers.notify(&event, &self.graph);
        Ok(())
    }

    /// What to evict for a `request` that does not fit. Under `drop` and
    /// `hybrid` the heuristic chooses (`hybrid` then decides per victim how
    /// it comes back). Under `swap` a candidate's cost is what bringing it
    /// back takes, the transfer and any wait for its copy, over its size
    /// and staleness as in h_DTR.
    pub(super) fn choose_victims(&mut self, request: u64) -> crate::policy::Victims {
        let view = self.table.policy_view(&self.graph);
        let pool = self.table.pool();
        if self.config.restore != RestoreMode::Swap {
            return self
                .heuristic
                .choose(pool, &view, request, &mut self.search);
        }
        let config = &self.config;
        let (graph, table, queue) = (&self.graph, &self.table, &self.copies);
        let swap_density = |storage: StorageId| {
            let bytes = graph.storages[storage].bytes;
            let wait = match table.host_copy_ready_at(storage) {
                Some(ready) => ready.saturating_sub(graph.clock),
                None if table.host_has_room(graph, storage, config.swap.host_memory) => {
                    let start = graph.clock.max(queue.to_host_until);
                    start + config.swap.transfer_cost(bytes) - graph.clock
                }
                None => return f64::INFINITY,
            };
            let cost = wait.saturating_add(config.swap.transfer_cost(bytes));
            let denominator = bytes as f64 * graph.staleness(storage) as f64;
            if denominator > 0.0 {
                cost as f64 / denominator
            } else {
                f64::INFINITY
            }
        };
        let found = self
            .search
            .lowest(pool, |candidate, _| Some(swap_density(candidate.storage)));
        crate::policy::Victims {
            storages: found.iter().map(|&(storage, _)| storage).collect(),
            score: found.map(|(_, score)| score),
        }
    }

    /// Compute waits for the copy queue until `time`.
    fn stall_until(&mut self, time: u64) {
        let stall = time.saturating_sub(self.graph.clock);
        self.graph.clock += stall;
        if stall > 0 {
            let event = RunEvent::Stalled { cost: stall };
            self.observers.notify(&event, &self.graph);
        }
    }

    /// What recomputing `storage` would cost now: its own ops, and those
    /// that make its inputs that are not in memory (one level). Counting
    /// the whole evicted region behind it instead made `hybrid` copy back
    /// storages whose ancestors were needed again anyway, and run slower
    /// than `drop` (DenseNet-121 at 0.3: 1.58 against 1.45); counting its
    /// own ops alone never found a copy worth it at 16 GB/s.
    fn recompute_estimate(&self, storage: StorageId) -> u64 {
        let graph = &self.graph;
        let info = &graph.storages[storage];
        let Some((node, _)) = graph.tensors[info.tensors[0]].producer else {
            return info.cost;
        };
        graph.nodes[node]
            .inputs
            .iter()
            .filter(|&&t| graph.tensors[t].storage != storage && !graph.tensors[t].defined)
            .map(|&t| graph.storages[graph.tensors[t].storage].cost)
            .fold(info.cost, u64::saturating_add)
    }
}
