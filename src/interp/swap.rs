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
//! - **Write-back.** While ops run, the queue copies the storages they
//!   make to host memory, oldest first, as far as its time and the host
//!   memory limit allow. Evicting a storage whose copy is complete frees
//!   its bytes at once, with no stall: that copy overlapped compute.
//! - **Constants.** A storage that cannot be recomputed (parameters,
//!   optimiser state, accumulated gradients) becomes an eviction candidate
//!   once it has a host copy, priced by its transfer as its `c0`; it only
//!   ever leaves by swap and comes back by copy. The queue copies constants
//!   when it has no op output left to copy, and when nothing else can make
//!   room, the stalest constant is copied on demand (the clock stalls).
//!   Near a full budget these are most of what is resident. Copying them
//!   ahead of op outputs measured worse on the authors' logs (the queue's
//!   time went to parameters that were never evicted).
//! - **Swap-out on demand.** Evicting by swap a storage without a complete
//!   copy waits for the copy to finish (compute cannot reuse the bytes
//!   before): the clock stalls.
//! - **Swap-in.** Bringing a storage back waits for its transfer (after the
//!   one in flight to the device; a prefetch under way gives way to it):
//!   the clock stalls.
//! - **Parking.** Under `hybrid`, a rematerialisation that runs out of
//!   memory even restoring from host copies is tried once more with the
//!   pending ops' locks surrendered; a storage evicted then, or one the
//!   rematerialisation guard held back until nothing else was left, leaves
//!   by copy (the clock waits) and comes back by copy: its recomputation
//!   could not fit.
//! - **Prefetch.** When the to-device queue is idle and memory has room,
//!   the most recently made storage evicted with a host copy is copied
//!   back ahead of need; only an op that reads it before the copy ends
//!   waits, for the rest. A prefetch not read yet is the first victim
//!   when room is needed, so prefetches use only memory nothing else
//!   needs; once one has given its room back, prefetch waits until the
//!   user's op has run (the rematerialisation under way needs the
//!   memory: without the pause a small prefetch went back and forth
//!   before each op of a deep rematerialisation). Where the future is
//!   known and the heuristic looks ahead (`hybrid` in a replay under
//!   `dtr-next`), the storage needed soonest comes back instead, and the
//!   heuristic alone decides whether an unread prefetch gives way.
//!
//! Stalls advance the clock and count in the overhead and the thrash limit.
//! Tensors never change in place, so a host copy stays valid while its
//! storage lives and is kept after a swap-in: evicting it again is free.
//!
//! [`SwapConfig::bandwidth`]: crate::SwapConfig::bandwidth

use std::collections::{BTreeMap, VecDeque};

use slotmap::SecondaryMap;

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
    /// Constants to write back once `write_back` is empty.
    constants: VecDeque<(StorageId, u64)>,
    /// The order in which swapping first saw each storage made.
    born: SecondaryMap<StorageId, u64>,
    next_born: u64,
    /// Storages evicted with a host copy, by birth: what prefetch may bring
    /// back. Entries go stale when their storage comes back otherwise;
    /// they are checked when read.
    /// With each, its key in `by_next_read`, if it has one.
    swapped_out: BTreeMap<u64, (StorageId, Option<u64>)>,
    /// The same, where the program's future is known, by when the program
    /// next reads each (then by birth): every entry is also in
    /// `swapped_out`, with its key. A storage's next read moves while it is
    /// evicted only when a new step's foresight begins; entries are checked
    /// when read, like `swapped_out`'s.
    by_next_read: BTreeMap<(u64, u64), StorageId>,
    /// Prefetched storages no op has read yet, with when their transfer
    /// ends.
    unread: SecondaryMap<StorageId, u64>,
    /// Set when an unread prefetch gave its room back to an allocation:
    /// memory is short for what is running, so prefetch waits until the
    /// user's op has run or a tensor is released.
    paused: bool,
    /// Set while a rematerialisation that ran out of memory is retried
    /// restoring every storage with a host copy from it.
    pub(super) prefer_host_copies: bool,
    /// Set while such a rematerialisation, out of memory again, is retried
    /// with the pending ops' locks surrendered, the inputs evicted then
    /// leaving by copy.
    pub(super) parking: bool,
    /// Storages whose recomputation could not fit (held back by the guard
    /// until nothing else was left, or parked): each leaves by copy the
    /// next time it is evicted, and comes back by copy, whatever the
    /// estimates say.
    by_copy: SecondaryMap<StorageId, ()>,
}

impl CopyQueue {
    /// Forgets a storage the graph no longer has.
    pub(super) fn forget(&mut self, storage: StorageId) {
        if let Some(born) = self.born.remove(storage) {
            self.unlist(born);
        }
        self.unread.remove(storage);
        self.by_copy.remove(storage);
    }

    /// Takes the storage made `born`th off the lists prefetch reads.
    fn unlist(&mut self, born: u64) {
        if let Some((_, Some(at))) = self.swapped_out.remove(&born) {
            self.by_next_read.remove(&(at, born));
        }
    }
}

impl<B: Backend> Interpreter<B> {
    fn swapping(&self) -> bool {
        self.config.restore != RestoreMode::Drop
    }

    /// Whether the heuristic chooses the victims knowing when each storage
    /// is read next (`hybrid` under a heuristic that looks ahead, in a
    /// replay or a step that repeats the last). `swap` prices victims by
    /// staleness, so prefetch there keeps reading only the past.
    fn victims_looking_ahead(&self) -> bool {
        self.config.restore == RestoreMode::Hybrid && self.graph.foresight.known
    }

    /// Whether a rematerialisation that ran out of memory may be tried
    /// again restoring from host copies what `hybrid` chose to recompute:
    /// a copy brings back one storage, where a recomputation may hold a
    /// whole chain of inputs at once.
    pub(super) fn may_retry_from_host_copies(&self) -> bool {
        self.config.restore == RestoreMode::Hybrid && !self.copies.prefer_host_copies
    }

    /// Under `swap` and `hybrid`, `storage`'s recomputation could not fit
    /// (see [`CopyQueue::by_copy`]): the next time it is evicted it leaves
    /// by copy, the clock waiting for the copy to be written, and it comes
    /// back by copy, with no chain of recomputations behind it.
    pub(super) fn leave_by_copy(&mut self, storage: StorageId) {
        if self.swapping() && self.graph.storages[storage].recomputable {
            self.copies.by_copy.insert(storage, ());
        }
    }

    /// `storage` is resident again, by copy or by recomputation.
    pub(super) fn note_restored(&mut self, storage: StorageId) {
        self.copies.by_copy.remove(storage);
    }

    /// Whether some prefetched storage has not been read yet.
    pub(super) fn has_unread_prefetches(&self) -> bool {
        !self.copies.unread.is_empty()
    }

    /// Queues a storage just made (by an op, a put or a detach) for
    /// write-back, when swapping under a budget.
    pub(super) fn queue_write_back(&mut self, storage: StorageId) {
        let budgeted = self.table.counter().budget_bytes().is_some();
        if self.swapping() && budgeted {
            let queue = match self.graph.storages[storage].recomputable {
                true => &mut self.copies.write_back,
                false => &mut self.copies.constants,
            };
            queue.push_back((storage, self.graph.clock));
            if !self.copies.born.contains_key(storage) {
                self.copies.born.insert(storage, self.copies.next_born);
                self.copies.next_born += 1;
            }
        }
    }

    /// Lets the copy queue write storages back until it catches up with the
    /// clock (the last copy may end after it). Storages that are gone, or
    /// that do not fit in host memory, are skipped.
    pub(super) fn write_back(&mut self) {
        if self.copies.write_back.is_empty() && self.copies.constants.is_empty() {
            return; // not swapping, or nothing made since
        }
        let limit = self.config.swap.host_memory;
        while self.copies.to_host_until < self.graph.clock {
            let queue = &mut self.copies;
            let Some((storage, made_at)) = queue
                .write_back
                .pop_front()
                .or_else(|| queue.constants.pop_front())
            else {
                break;
            };
            let Some(info) = self.graph.storages.get(storage) else {
                continue;
            };
            if !info.is_resident()
                || self.table.host_copy_ready_at(storage).is_some()
                || !self.table.host_has_room(&self.graph, storage, limit)
            {
                continue;
            }
            if let Err(error) = self.start_host_copy(storage, made_at) {
                tracing::warn!(target: "dtr::swap", %error, "write-back failed; the storage will be recomputed if evicted");
            }
        }
    }

    /// Copies resident `storage` to host memory on the to-host queue, from
    /// `start` or once the queue is free; returns when the copy completes.
    /// A constant is an eviction candidate from now on.
    fn start_host_copy(&mut self, storage: StorageId, start: u64) -> Result<u64> {
        let bytes = self.graph.storages[storage].bytes;
        let end = (start.max(self.copies.to_host_until))
            .saturating_add(self.config.swap.transfer_cost(bytes));
        self.table
            .copy_to_host(&self.graph, storage, &mut self.backend, end)?;
        self.copies.to_host_until = end;
        if !self.graph.storages[storage].recomputable {
            self.table.refresh_candidacy(&self.graph, storage);
        }
        let event = RunEvent::HostCopied { storage, bytes };
        self.observers.notify(&event, &self.graph);
        Ok(end)
    }

    /// The last resort when no candidate is left to make room: copies the
    /// stalest constant that has no host copy yet, is held by no op or
    /// pin, and fits in host memory, behind whatever the queue is writing;
    /// it is then a candidate, and evicting it waits for the copy.
    /// Returns whether there was one.
    pub(super) fn copy_out_a_constant(&mut self) -> bool {
        if !self.swapping() {
            return false;
        }
        let limit = self.config.swap.host_memory;
        let Some(storage) = self.table.stalest_uncopied_constant(&self.graph, limit) else {
            return false;
        };
        match self.start_host_copy(storage, self.graph.clock) {
            Ok(_) => true,
            Err(error) => {
                tracing::warn!(target: "dtr::swap", %error, "copying a constant out failed");
                false
            }
        }
    }

    /// Prepares to evict `storage`: whether it can then come back from a
    /// host copy. A complete copy costs nothing; otherwise, if swapping
    /// pays (always under `swap`, by the estimates under `hybrid`) and host
    /// memory has room, the clock stalls until its copy is written. A copy
    /// still being written is abandoned if not waited for (its bytes are
    /// about to be reused). Eager evictions (of storages nothing holds)
    /// never wait. A constant always has a copy (else it is no candidate)
    /// and always waits for it.
    pub(super) fn swap_out(&mut self, storage: StorageId, eager: bool) -> bool {
        let now = self.graph.clock;
        let ready_at = self.table.host_copy_ready_at(storage);
        if ready_at.is_some_and(|ready| ready <= now) {
            return true;
        }
        if !self.graph.storages[storage].recomputable {
            let ready = ready_at.expect("a constant is a candidate only with a host copy");
            debug_assert!(!eager, "constants are not evicted eagerly");
            self.stall_until(ready);
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
            RestoreMode::Hybrid if self.copies.by_copy.contains_key(storage) => true,
            RestoreMode::Hybrid => {
                (end - now).saturating_add(transfer) < self.recompute_estimate(storage)
            }
        };
        if eager || !pays || !room {
            self.table.drop_host_copy(storage);
            return false;
        }
        if ready_at.is_none() {
            if let Err(error) = self.start_host_copy(storage, now) {
                tracing::warn!(target: "dtr::swap", %error, "swap-out failed; dropping instead");
                return false;
            }
        }
        self.stall_until(end);
        true
    }

    /// Whether evicted `storage` comes back from its host copy (else it is
    /// recomputed): under `hybrid`, when the transfer is estimated cheaper;
    /// always for a constant, which cannot be recomputed.
    pub(super) fn restores_from_host(&self, storage: StorageId) -> bool {
        if self.table.host_copy_ready_at(storage).is_none() {
            return false;
        }
        if !self.graph.storages[storage].recomputable {
            return true;
        }
        match self.config.restore {
            RestoreMode::Drop => false,
            RestoreMode::Swap => true,
            // Retrying a rematerialisation that ran out of memory: every copy.
            RestoreMode::Hybrid if self.copies.prefer_host_copies => true,
            RestoreMode::Hybrid if self.copies.by_copy.contains_key(storage) => true,
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
        self.abort_prefetches();
        let info = &self.graph.storages[storage];
        let (bytes, root) = (info.bytes, info.tensors[0]);
        let room = match self.graph.tensors[root].producer {
            Some(node) => RoomFor::Op {
                node,
                rematerializing: true,
            },
            None => RoomFor::CopyBack,
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
        self.note_restored(storage);
        self.heuristic.on_rematerialize(storage, &self.graph);
        let event = RunEvent::SwappedIn { storage, bytes };
        self.observers.notify(&event, &self.graph);
        Ok(())
    }

    /// Notes that `storage` was just evicted, with a host copy (`to_host`)
    /// or without, `eager`ly or to make room: only storages evicted with a
    /// copy while held are prefetched (an eagerly evicted one is read
    /// again only by recomputations of its dependents).
    pub(super) fn note_evicted(&mut self, storage: StorageId, to_host: bool, eager: bool) {
        self.copies.unread.remove(storage);
        let wanted = to_host && !eager;
        if let (true, Some(&born)) = (wanted, self.copies.born.get(storage)) {
            // Kept by next read only where prefetch looks ahead.
            let next_read = (self.victims_looking_ahead())
                .then(|| self.graph.next_read(storage))
                .flatten();
            self.copies.unlist(born);
            self.note_swapped_out(storage, born, next_read);
        }
    }

    /// Lists `storage` (made `born`th) for prefetch, by its `next_read`
    /// too when it has one.
    fn note_swapped_out(&mut self, storage: StorageId, born: u64, next_read: Option<u64>) {
        self.copies.swapped_out.insert(born, (storage, next_read));
        if let Some(at) = next_read {
            self.copies.by_next_read.insert((at, born), storage);
        }
    }

    /// Prefetch: when the to-device queue is idle, starts copying back the
    /// storage evicted with a host copy, while the program held it, that
    /// was made last (a backward pass reads activations in the reverse
    /// order of their making), if it fits in the free memory. It evicts
    /// nothing; its bytes are reserved from now and its tensors defined,
    /// and an op that reads them before the transfer ends waits for the
    /// rest of it. It reads only the past, so it works the same where the
    /// program's future is unknown (the eager API, PyTorch); where the
    /// victims are chosen looking ahead, [`Self::prefetch_by_foresight`].
    pub(super) fn prefetch(&mut self) {
        if self.copies.swapped_out.is_empty() || self.schedule.is_some() {
            return;
        }
        let Some(budget) = self.table.counter().budget_bytes() else {
            return;
        };
        if self.victims_looking_ahead() {
            return self.prefetch_by_foresight(budget);
        }
        if self.copies.paused {
            return;
        }
        while self.copies.to_device_until <= self.graph.clock {
            let Some((&born, &(storage, _))) = self.copies.swapped_out.last_key_value() else {
                break;
            };
            if !self.prefetchable(storage) {
                self.copies.unlist(born);
                continue;
            }
            let Some(block) = self.room_for_prefetch(storage, budget) else {
                break;
            };
            self.copies.unlist(born);
            self.start_prefetch(storage, block);
        }
    }

    /// A block for `storage` in memory nothing else uses, if there is one.
    fn room_for_prefetch(
        &mut self,
        storage: StorageId,
        budget: u64,
    ) -> Option<crate::memory::Block> {
        let bytes = self.graph.storages[storage].bytes;
        if self.table.counter().in_use_bytes().saturating_add(bytes) > budget {
            return None;
        }
        Some(self.table.reserve(&[bytes], &[])?[0])
    }

    /// Whether `storage` is evicted with a complete host copy.
    fn prefetchable(&self, storage: StorageId) -> bool {
        let evicted = self
            .graph
            .storages
            .get(storage)
            .is_some_and(|info| info.residency == crate::graph::Residency::Evicted);
        evicted
            && self
                .table
                .host_copy_ready_at(storage)
                .is_some_and(|ready| ready <= self.graph.clock)
    }

    /// Prefetch where the victims are chosen looking ahead: while the
    /// to-device queue is idle, the swapped-out storage the program reads
    /// soonest comes back, if it fits in the free memory (one read only by
    /// recomputations of others stays out: counting those reads changed
    /// no overhead on the authors' logs). Nothing gives way to it, and
    /// nothing gives it room back first: the heuristic, which sees it is
    /// read soon, decides. Measured on the authors' logs against the
    /// storage made last, with unread prefetches the first victims
    /// (`--restore hybrid` under `dtr-next` at 0.3 of the peak and 16
    /// GB/s): DenseNet-121 1.197 → 1.154, InceptionV4 1.153 → 1.122.
    fn prefetch_by_foresight(&mut self, budget: u64) {
        while self.copies.to_device_until <= self.graph.clock {
            let Some((&(at, born), &storage)) = self.copies.by_next_read.first_key_value() else {
                return;
            };
            if !self.prefetchable(storage) {
                self.copies.unlist(born); // it came back otherwise, or is gone
                continue;
            }
            let next_read = self.graph.next_read(storage);
            if next_read != Some(at) {
                // A new step's foresight moved it.
                self.copies.unlist(born);
                self.note_swapped_out(storage, born, next_read);
                continue;
            }
            let Some(block) = self.room_for_prefetch(storage, budget) else {
                return;
            };
            self.copies.unlist(born);
            self.start_prefetch(storage, block);
        }
    }

    /// Starts copying evicted `storage` back into `block`: its tensors are
    /// defined from now, and an op that reads them before the transfer
    /// ends waits for the rest.
    fn start_prefetch(&mut self, storage: StorageId, block: crate::memory::Block) {
        let now = self.graph.clock;
        let info = &self.graph.storages[storage];
        let (bytes, root) = (info.bytes, info.tensors[0]);
        let at = self.table.memory().arena().is_some().then_some(block);
        if let Err(error) =
            self.table
                .copy_from_host(&mut self.graph, storage, &mut self.backend, block, at)
        {
            self.table.unreserve(block);
            tracing::warn!(target: "dtr::swap", %error, "prefetch failed; the storage comes back when needed");
            return;
        }
        let end = now.saturating_add(self.config.swap.transfer_cost(bytes));
        self.copies.to_device_until = end;
        self.copies.unread.insert(storage, end);
        self.graph.tensors[root].defined = true;
        self.note_restored(storage);
        self.heuristic.on_rematerialize(storage, &self.graph);
        let event = RunEvent::Prefetched {
            storage,
            bytes,
            arrives_at: end,
        };
        self.observers.notify(&event, &self.graph);
    }

    /// Lets prefetch start again after an unread prefetch gave its room
    /// back: called once the user's op has run, and when a tensor is
    /// released.
    pub(super) fn resume_prefetch(&mut self) {
        self.copies.paused = false;
    }

    /// Gives the to-device queue to a copy needed now: prefetches still
    /// under way and not locked are abandoned (their storages evicted
    /// again, their host copies kept).
    fn abort_prefetches(&mut self) {
        let now = self.graph.clock;
        if self.copies.to_device_until <= now {
            return;
        }
        let in_flight: Vec<StorageId> = self
            .copies
            .unread
            .iter()
            .filter(|&(_, &end)| end > now)
            .map(|(storage, _)| storage)
            .collect();
        let mut until = now;
        for storage in in_flight {
            if self.table.can_evict(&self.graph, storage) {
                self.evict(storage, false, None);
            } else {
                until = until.max(self.copies.unread[storage]);
            }
        }
        self.copies.to_device_until = until;
    }

    /// `storage` is about to be read: if it is a prefetch not read yet,
    /// compute waits for the rest of its transfer.
    pub(super) fn await_arrival(&mut self, storage: StorageId) {
        if let Some(end) = self.copies.unread.remove(storage) {
            self.stall_until(end);
        }
    }

    /// The prefetched storage not read yet that was made first (the one a
    /// backward pass would read last), if one can be evicted: prefetches
    /// fill only memory nothing else needs, so they give it back first.
    fn unread_prefetch(&self) -> Option<StorageId> {
        let (pool, copies) = (self.table.pool(), &self.copies);
        copies
            .unread
            .keys()
            .filter(|&storage| pool.contains(storage))
            .min_by_key(|&storage| copies.born.get(storage).copied().unwrap_or(0))
    }

    /// What to evict for a `request` that does not fit. A prefetched
    /// storage not read yet goes first (its host copy is kept). Under `drop` and
    /// `hybrid` the heuristic chooses (`hybrid` then decides per victim how
    /// it comes back). Under `swap` a candidate's cost is what bringing it
    /// back takes, the transfer and any wait for its copy, over its size
    /// and staleness as in h_DTR.
    pub(super) fn choose_victims(&mut self, request: u64, guard: bool) -> crate::policy::Victims {
        let first = (!self.victims_looking_ahead()).then(|| self.unread_prefetch());
        if let Some(storage) = first.flatten() {
            self.copies.paused = true;
            return crate::policy::Victims {
                storages: smallvec::smallvec![storage],
                ..Default::default()
            };
        }
        self.heuristic
            .update_bounds(self.table.bounds(), &self.graph);
        let view = self.table.policy_view(&self.graph);
        let pool = self.table.pool();
        if self.config.restore != RestoreMode::Swap {
            // The guard applied inside the search: one search instead of
            // one per candidate it holds back.
            let room = self
                .remat_room()
                .filter(|_| guard && self.config.guard_in_search);
            let (footprint, graph) = (&mut self.footprint, &self.graph);
            let mut admit =
                |storage| room.is_none_or(|room| !footprint.exceeds(graph, storage, room));
            let admit: crate::policy::Admit<'_> = match room {
                Some(_) => Some(&mut admit),
                None => None,
            };
            return self
                .heuristic
                .choose(pool, &view, request, &mut self.search, admit);
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
        let found = self.search.lowest(pool, None, |candidate, _| {
            Some(swap_density(candidate.storage))
        });
        crate::policy::Victims {
            storages: found.iter().map(|&(storage, _)| storage).collect(),
            score: found.map(|(_, score)| score),
            ..Default::default()
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
        let Some(node) = graph.tensors[info.tensors[0]].producer else {
            return info.cost;
        };
        graph.nodes[node]
            .inputs()
            .iter()
            .filter(|&&t| graph.tensors[t].storage != storage && !graph.tensors[t].defined)
            .map(|&t| graph.storages[graph.tensors[t].storage].cost)
            .fold(info.cost, u64::saturating_add)
    }
}
