//! The storage table: where every storage's bytes are, and what may move them.
//!
//! It owns the memory accounting (counter or arena), the buffer and block of
//! each resident storage, its lock and pin counts, and the pool of eviction
//! candidates. Every change of residency goes through it, so the graph's
//! `residency`, the tensors' `defined` flags, the buffers, the blocks and the
//! pool cannot disagree: the one place where a new way of holding bytes
//! (host swap, static offsets, a foreign framework's storages) hooks in.
//!
//! The graph keeps `residency` because heuristics read it; only this module
//! writes it.

use std::collections::HashMap;

use slotmap::SecondaryMap;

use crate::backend::{Backend, BufferView};
use crate::error::Result;
use crate::graph::{Graph, Residency, StorageId};
use crate::memory::packing::Lifetime;
use crate::memory::{Block, Memory, MemoryCounter, Move};
use crate::ops::ELEMENT_BYTES;
use crate::policy::{CandidatePool, PolicyView};
use crate::shape::Layout;

/// A storage's bytes in host memory. Tensors never change in place, so a
/// copy stays valid for as long as its storage lives, resident or not.
struct HostCopy {
    values: Vec<f32>,
    /// The storage's size, as counted in host memory.
    bytes: u64,
    /// When the copy queue finishes writing it (on the interpreter's clock).
    ready_at: u64,
}

/// What the table keeps of one storage.
struct Slot<Buf> {
    /// The bytes, while resident.
    buffer: Option<Buf>,
    /// Held by running or pending ops: not evictable.
    locks: u32,
    /// Held by the user: not evictable.
    pins: u32,
    /// Resident and not recomputable: counted in `constant_bytes`.
    constant: bool,
}

pub(super) struct StorageTable<B: Backend> {
    memory: Memory,
    slots: SecondaryMap<StorageId, Slot<B::Buffer>>,
    /// The block of every resident storage (apart from `slots` because
    /// policies read it and are not generic over buffers).
    blocks: SecondaryMap<StorageId, Block>,
    /// The storages with a copy in host memory (swap), counted in
    /// `host_bytes`. Apart from `slots`: few storages have one, and every
    /// storage has a slot.
    host_copies: HashMap<StorageId, HostCopy, foldhash::fast::RandomState>,
    /// Resident, unlocked and unpinned storages that can come back:
    /// recomputable, or with a host copy (see [`StorageTable::restorable`]).
    pool: CandidatePool,
    /// Bytes of the resident storages that are not recomputable (puts,
    /// detached tensors), and their high-water mark.
    constant_bytes: u64,
    constant_peak_bytes: u64,
    /// Bytes of the host copies, and their high-water mark.
    host_bytes: u64,
    host_peak_bytes: u64,
    /// Every allocation's lifetime, when recording for a static plan.
    log: Option<AllocationLog>,
    /// Smaller storages are never candidates ([`crate::Config::min_evictable_bytes`]).
    min_evictable_bytes: u64,
}

/// The lifetimes of a run's allocations. Time counts reservations: the
/// blocks of reservation `k` are made at `2k` and frees before the next
/// reservation happen at `2k + 1`.
#[derive(Default)]
struct AllocationLog {
    now: u64,
    lifetimes: Vec<Lifetime>,
    /// Where each was placed (arena memory; 0 when bytes are counted).
    offsets: Vec<u64>,
    /// The lifetime of each installed storage's block.
    open: SecondaryMap<StorageId, usize>,
    /// Blocks reserved and not yet installed or returned.
    reserved: Vec<(Block, usize)>,
}

impl AllocationLog {
    fn close(&mut self, lifetime: usize) {
        self.lifetimes[lifetime].end = self.now + 1;
    }

    fn take_reserved(&mut self, block: Block) -> Option<usize> {
        let at = self.reserved.iter().position(|&(b, _)| b == block)?;
        // `remove`, not `swap_remove`: equal blocks (counter memory) go in order.
        Some(self.reserved.remove(at).1)
    }
}

impl<B: Backend> StorageTable<B> {
    pub(super) fn new(memory: Memory, min_evictable_bytes: u64) -> StorageTable<B> {
        StorageTable {
            memory,
            slots: SecondaryMap::new(),
            blocks: SecondaryMap::new(),
            host_copies: HashMap::default(),
            pool: CandidatePool::new(),
            constant_bytes: 0,
            constant_peak_bytes: 0,
            host_bytes: 0,
            host_peak_bytes: 0,
            log: None,
            min_evictable_bytes,
        }
    }

    /// Starts tracking a storage the graph just created (not yet resident).
    pub(super) fn register(&mut self, storage: StorageId) {
        self.slots.insert(
            storage,
            Slot {
                buffer: None,
                locks: 0,
                pins: 0,
                constant: false,
            },
        );
    }

    /// Reserves a block for each of `sizes` if they all fit now; the blocks
    /// belong to no storage until [`StorageTable::install`]. Those marked in
    /// `lasting` (one mark per size, or none) the program keeps: an arena
    /// places them apart.
    pub(super) fn reserve(&mut self, sizes: &[u64], lasting: &[bool]) -> Option<Vec<Block>> {
        let blocks = self.memory.allocate_all(sizes, lasting)?;
        if let Some(log) = &mut self.log {
            log.now += 2;
            for &block in &blocks {
                log.reserved.push((block, log.lifetimes.len()));
                log.offsets.push(block.offset);
                log.lifetimes.push(Lifetime {
                    bytes: block.size,
                    start: log.now,
                    end: u64::MAX,
                });
            }
        }
        Some(blocks)
    }

    /// In a compacting arena, moves at most `most_bytes` of resident
    /// storages' blocks so that `sizes` fit (see
    /// [`Memory::make_room_by_moving`]); the moves, or `None` with nothing
    /// moved.
    pub(super) fn make_room_by_moving(
        &mut self,
        sizes: &[u64],
        most_bytes: u64,
    ) -> Option<Vec<Move>> {
        let moves = self.memory.make_room_by_moving(sizes, most_bytes)?;
        for m in &moves {
            debug_assert_eq!(self.blocks.get(m.owner), Some(&m.from), "a move's block");
            self.blocks.insert(m.owner, m.to);
        }
        Some(moves)
    }

    /// Moves resident storages' blocks to the offsets given, at once, as a
    /// static plan recorded a compaction; `None`, with nothing moved, where
    /// they cannot go (or one is not resident).
    pub(super) fn move_blocks(&mut self, targets: &[(StorageId, u64)]) -> Option<Vec<Move>> {
        let blocks = (targets.iter())
            .map(|&(storage, to)| Some((*self.blocks.get(storage)?, to)))
            .collect::<Option<Vec<_>>>()?;
        let moves = self.memory.move_blocks(&blocks)?;
        for (&(storage, _), m) in targets.iter().zip(&moves) {
            self.blocks.insert(storage, m.to);
        }
        Some(moves)
    }

    /// Which recorded allocation a resident storage's block is (recording
    /// for a static plan).
    pub(super) fn allocation_of(&self, storage: StorageId) -> Option<usize> {
        self.log.as_ref()?.open.get(storage).copied()
    }

    /// Returns a reserved block that was not installed.
    pub(super) fn unreserve(&mut self, block: Block) {
        if let Some(log) = &mut self.log {
            if let Some(lifetime) = log.take_reserved(block) {
                log.close(lifetime);
            }
        }
        self.memory.free(block);
    }

    /// Starts recording every allocation's lifetime (for a static plan).
    pub(super) fn record_lifetimes(&mut self) {
        self.log = Some(AllocationLog::default());
    }

    /// The lifetimes recorded so far, in allocation order; those still
    /// alive end now.
    pub(super) fn lifetimes(&self) -> Vec<Lifetime> {
        let Some(log) = &self.log else {
            return Vec::new();
        };
        let mut lifetimes = log.lifetimes.clone();
        for lifetime in &mut lifetimes {
            lifetime.end = lifetime.end.min(log.now + 1);
        }
        lifetimes
    }

    /// The offset of each allocation recorded so far, in allocation order
    /// (0 in counter memory).
    pub(super) fn offsets(&self) -> Vec<u64> {
        self.log
            .as_ref()
            .map_or_else(Vec::new, |log| log.offsets.clone())
    }

    /// Places the following allocations at a static plan's offsets.
    pub(super) fn follow_offsets(&mut self, offsets: Vec<u64>) {
        self.memory.follow_offsets(offsets);
    }

    /// Makes `storage` resident with `buffer` in `block`.
    pub(super) fn install(
        &mut self,
        graph: &mut Graph,
        storage: StorageId,
        buffer: B::Buffer,
        block: Block,
    ) {
        if let Some(log) = &mut self.log {
            if let Some(lifetime) = log.take_reserved(block) {
                log.open.insert(storage, lifetime);
            }
        }
        let slot = &mut self.slots[storage];
        debug_assert!(slot.buffer.is_none(), "installing over a resident storage");
        slot.buffer = Some(buffer);
        self.blocks.insert(storage, block);
        self.memory.set_owner(block, Some(storage));
        graph.storages[storage].residency = Residency::Resident;
        self.refresh_candidacy(graph, storage);
    }

    /// Frees a resident storage's bytes, keeping its compute history: its
    /// tensors become undefined. Only candidates are evicted.
    pub(super) fn evict(&mut self, graph: &mut Graph, storage: StorageId, backend: &mut B) {
        debug_assert!(self.pool.contains(storage), "evicting a protected storage");
        self.release_bytes(storage, backend);
        let info = &mut graph.storages[storage];
        info.residency = Residency::Evicted;
        for &tensor in &info.tensors {
            graph.tensors[tensor].defined = false;
        }
    }

    /// Forgets a storage the graph no longer has, freeing its bytes and
    /// its host copy.
    pub(super) fn remove(&mut self, storage: StorageId, backend: &mut B) {
        self.release_bytes(storage, backend);
        self.drop_host_copy(storage);
        self.slots.remove(storage);
    }

    /// When the host copy of `storage` is (or will be) complete, if it has one.
    pub(super) fn host_copy_ready_at(&self, storage: StorageId) -> Option<u64> {
        self.host_copies.get(&storage).map(|copy| copy.ready_at)
    }

    /// Whether host memory under `limit` has room for a copy of `storage`.
    pub(super) fn host_has_room(
        &self,
        graph: &Graph,
        storage: StorageId,
        limit: Option<u64>,
    ) -> bool {
        let bytes = graph.storages[storage].bytes;
        limit.is_none_or(|limit| self.host_bytes.saturating_add(bytes) <= limit)
    }

    /// Copies a resident storage's bytes to host memory; the copy counts as
    /// complete from `ready_at`. The device bytes stay where they are.
    pub(super) fn copy_to_host(
        &mut self,
        graph: &Graph,
        storage: StorageId,
        backend: &mut B,
        ready_at: u64,
    ) -> Result<()> {
        let bytes = graph.storages[storage].bytes;
        let slot = &mut self.slots[storage];
        let buffer = slot
            .buffer
            .as_ref()
            .expect("only resident storages are copied");
        let layout = whole_storage(bytes);
        let values = backend.read(BufferView {
            buffer,
            layout: &layout,
        })?;
        let copied = HostCopy {
            values,
            bytes,
            ready_at,
        };
        let previous = self.host_copies.insert(storage, copied);
        debug_assert!(previous.is_none(), "copying a storage to host twice");
        self.host_bytes += bytes;
        self.host_peak_bytes = self.host_peak_bytes.max(self.host_bytes);
        Ok(())
    }

    /// Makes an evicted storage with a host copy resident again in `block`
    /// (placed at `at` in arena memory), keeping the copy.
    pub(super) fn copy_from_host(
        &mut self,
        graph: &mut Graph,
        storage: StorageId,
        backend: &mut B,
        block: Block,
        at: Option<Block>,
    ) -> Result<()> {
        let bytes = graph.storages[storage].bytes;
        let copy = self
            .host_copies
            .get(&storage)
            .expect("only storages with a host copy are copied back");
        let buffer = backend.upload(&copy.values, &whole_storage(bytes), at)?;
        self.install(graph, storage, buffer, block);
        Ok(())
    }

    /// Whether `storage` could come back after an eviction: by recomputation,
    /// or from its host copy. A storage that is not recomputable (a put, a
    /// detached tensor) is evicted only once it has a host copy, and only
    /// by swapping; it keeps that copy while it lives.
    pub(super) fn restorable(&self, graph: &Graph, storage: StorageId) -> bool {
        graph.storages[storage].recomputable || self.host_copies.contains_key(&storage)
    }

    /// The resident constant accessed longest ago that has no host copy,
    /// is neither locked nor pinned, and whose copy fits in host memory
    /// under `limit` (ties: the lowest id, so runs are deterministic).
    /// A scan of every storage: it runs only when nothing else can be
    /// evicted.
    pub(super) fn stalest_uncopied_constant(
        &self,
        graph: &Graph,
        limit: Option<u64>,
    ) -> Option<StorageId> {
        self.slots
            .iter()
            .filter(|(id, slot)| {
                slot.constant
                    && slot.locks == 0
                    && slot.pins == 0
                    && !self.host_copies.contains_key(id)
                    && self.host_has_room(graph, *id, limit)
            })
            .min_by_key(|&(id, _)| (graph.storages[id].last_access, id))
            .map(|(id, _)| id)
    }

    /// Forgets the host copy of `storage`, if it has one (the caller then
    /// refreshes its candidacy if it is not recomputable).
    pub(super) fn drop_host_copy(&mut self, storage: StorageId) {
        if self.host_copies.is_empty() {
            return; // the common case, without hashing
        }
        if let Some(copy) = self.host_copies.remove(&storage) {
            self.host_bytes -= copy.bytes;
        }
    }

    /// Bytes held in host memory now, and at most so far.
    pub(super) fn host_bytes(&self) -> (u64, u64) {
        (self.host_bytes, self.host_peak_bytes)
    }

    fn release_bytes(&mut self, storage: StorageId, backend: &mut B) {
        if let Some(slot) = self.slots.get_mut(storage) {
            if let Some(buffer) = slot.buffer.take() {
                backend.release(buffer);
            }
            if std::mem::take(&mut slot.constant) {
                let held = self.blocks.get(storage).map_or(0, |block| block.size);
                self.constant_bytes -= held;
            }
        }
        if let Some(block) = self.blocks.remove(storage) {
            self.memory.free(block);
        }
        if let Some(log) = &mut self.log {
            if let Some(lifetime) = log.open.remove(storage) {
                log.close(lifetime);
            }
        }
        self.pool.remove(storage);
    }

    /// The buffer of a resident storage.
    pub(super) fn buffer(&self, storage: StorageId) -> &B::Buffer {
        self.slots[storage]
            .buffer
            .as_ref()
            .expect("the storage is resident")
    }

    pub(super) fn lock(&mut self, storage: StorageId) {
        self.slots[storage].locks += 1;
        self.pool.remove(storage);
    }

    pub(super) fn unlock(&mut self, graph: &Graph, storage: StorageId) {
        self.slots[storage].locks -= 1;
        self.refresh_candidacy(graph, storage);
    }

    pub(super) fn pin(&mut self, storage: StorageId) {
        self.slots[storage].pins += 1;
        self.pool.remove(storage);
    }

    pub(super) fn unpin(&mut self, graph: &Graph, storage: StorageId) {
        self.slots[storage].pins -= 1;
        self.refresh_candidacy(graph, storage);
    }

    pub(super) fn is_locked(&self, storage: StorageId) -> bool {
        self.slots[storage].locks > 0
    }

    pub(super) fn is_pinned(&self, storage: StorageId) -> bool {
        self.slots[storage].pins > 0
    }

    /// Whether `storage` can be evicted now: resident, able to come back,
    /// held by no op and no pin. The policy's candidates are these, less
    /// those under [`crate::Config::min_evictable_bytes`]; evictions that
    /// are not the policy's (eager ones, asked for, planned) take any.
    pub(super) fn can_evict(&self, graph: &Graph, storage: StorageId) -> bool {
        let (Some(info), Some(slot)) = (graph.storages.get(storage), self.slots.get(storage))
        else {
            return false;
        };
        info.is_resident() && self.restorable(graph, storage) && slot.locks == 0 && slot.pins == 0
    }

    /// Puts a storage in or out of the candidate pool as its state says
    /// (after it stops or starts being recomputable, say).
    pub(super) fn refresh_candidacy(&mut self, graph: &Graph, storage: StorageId) {
        let info = &graph.storages[storage];
        let restorable = self.restorable(graph, storage);
        let slot = &mut self.slots[storage];
        let held = self
            .blocks
            .get(storage)
            .map_or(info.bytes, |block| block.size);
        // Storages stop being recomputable (detach) but never start again.
        if info.is_resident() && !info.recomputable && !slot.constant {
            slot.constant = true;
            self.constant_bytes += held;
            self.constant_peak_bytes = self.constant_peak_bytes.max(self.constant_bytes);
        }
        let evictable = info.bytes >= self.min_evictable_bytes;
        if info.is_resident() && restorable && evictable && slot.locks == 0 && slot.pins == 0 {
            self.pool.insert(storage, held, info);
        } else {
            self.pool.remove(storage);
        }
    }

    /// Gives the pool's entry of `storage` (if a candidate) the cost and
    /// last access the graph has now: call after changing either.
    pub(super) fn refresh_record(&mut self, graph: &Graph, storage: StorageId) {
        self.pool.refresh(storage, &graph.storages[storage]);
    }

    /// Takes a candidate out of the pool for now (the caller puts it back
    /// with [`StorageTable::refresh_candidacy`] before anyone else looks).
    pub(super) fn hold_back(&mut self, storage: StorageId) {
        self.pool.remove(storage);
    }

    /// Keeps the pool's summaries for √N draws, or not (see
    /// [`CandidatePool::keep_summaries`]).
    pub(super) fn keep_summaries(&mut self, keep: bool) {
        self.pool.keep_summaries(keep);
    }

    /// The extra costs of the pool's keys, for the heuristic to update.
    pub(super) fn bounds(&mut self) -> crate::policy::Bounds<'_> {
        self.pool.bounds()
    }

    /// Keeps the candidate pool in `order` (see [`CandidatePool::keep_order`]).
    pub(super) fn keep_order(&mut self, order: Option<crate::policy::PoolOrder>, from: usize) {
        self.pool.keep_order(order, from);
    }

    pub(super) fn pool(&self) -> &CandidatePool {
        &self.pool
    }

    pub(super) fn memory(&self) -> &Memory {
        &self.memory
    }

    pub(super) fn counter(&self) -> &MemoryCounter {
        self.memory.counter()
    }

    pub(super) fn set_budget_bytes(&mut self, budget_bytes: Option<u64>) {
        self.memory.set_budget_bytes(budget_bytes);
    }

    /// Bytes held by storages that no eviction can free (pinned, locked or
    /// not recomputable).
    pub(super) fn unevictable_bytes(&self) -> u64 {
        self.counter()
            .in_use_bytes()
            .saturating_sub(self.pool.bytes())
    }

    /// Whether evicting every candidate could open a block of `bytes`
    /// (aligned): in an arena that does not move blocks, free pieces and
    /// candidates must lie side by side for it. Always where bytes are
    /// only counted.
    pub(super) fn could_open_block(&self, bytes: u64) -> bool {
        match self.memory.arena() {
            Some(arena) if !self.memory.moves_blocks() => {
                arena.largest_openable(|storage| self.pool.contains(storage)) >= bytes
            }
            _ => true,
        }
    }

    /// The most bytes that resident storages which are not recomputable
    /// (puts, detached tensors) have held at once: memory no eviction could
    /// ever free, as high as the program has shown it to go.
    pub(super) fn constant_peak_bytes(&self) -> u64 {
        self.constant_peak_bytes
    }

    /// Bytes held by storages locked by running or pending ops.
    pub(super) fn locked_bytes(&self) -> u64 {
        self.slots
            .iter()
            .filter(|(_, slot)| slot.locks > 0)
            .filter_map(|(id, _)| self.blocks.get(id))
            .map(|block| block.size)
            .sum()
    }

    /// The `n` largest locked resident storages and their bytes, largest first.
    pub(super) fn largest_locked(&self, n: usize) -> Vec<(StorageId, u64)> {
        let mut locked: Vec<(StorageId, u64)> = self
            .slots
            .iter()
            .filter(|(_, slot)| slot.locks > 0)
            .filter_map(|(id, _)| Some((id, self.blocks.get(id)?.size)))
            .collect();
        locked.sort_by_key(|&(_, bytes)| std::cmp::Reverse(bytes));
        locked.truncate(n);
        locked
    }

    /// What a heuristic may look at.
    pub(super) fn policy_view<'a>(&'a self, graph: &'a Graph) -> PolicyView<'a> {
        PolicyView {
            graph,
            memory: &self.memory,
            blocks: &self.blocks,
        }
    }

    /// Checks that the table agrees with the graph: one slot per storage,
    /// buffers and blocks exactly for resident storages, no lock outside an
    /// op, the pool holding exactly the evictable storages, and the memory
    /// accounting matching the resident blocks and the budget.
    pub(super) fn check(&self, graph: &Graph) -> Result<(), String> {
        if self.slots.len() != graph.storages.len() {
            return Err(format!(
                "{} storages in the graph, {} in the table",
                graph.storages.len(),
                self.slots.len()
            ));
        }
        let mut resident_bytes = 0;
        let mut constant_bytes = 0;
        let mut host_bytes = 0;
        for (id, info) in &graph.storages {
            let slot = self
                .slots
                .get(id)
                .ok_or_else(|| format!("{id:?} is not in the storage table"))?;
            if slot.locks != 0 {
                return Err(format!("{id:?} still has {} locks", slot.locks));
            }
            if info.residency == Residency::Pending {
                return Err(format!("{id:?} is pending outside an op"));
            }
            if info.is_resident() != slot.buffer.is_some()
                || info.is_resident() != self.blocks.contains_key(id)
            {
                return Err(format!(
                    "{id:?} residency does not match its buffer and block"
                ));
            }
            if let Some(block) = self.blocks.get(id) {
                if block.size < info.bytes {
                    return Err(format!(
                        "{id:?} has {} B in a block of {} B",
                        info.bytes, block.size
                    ));
                }
                resident_bytes += block.size;
                if !info.recomputable {
                    constant_bytes += block.size;
                }
            }
            if let Some(copy) = self.host_copies.get(&id) {
                if copy.bytes != info.bytes {
                    return Err(format!("{id:?} has a host copy of another size"));
                }
                host_bytes += copy.bytes;
            }
            if slot.constant != (info.is_resident() && !info.recomputable) {
                return Err(format!("{id:?} is miscounted as a constant"));
            }
            let evictable = info.is_resident()
                && self.restorable(graph, id)
                && info.bytes >= self.min_evictable_bytes
                && slot.pins == 0;
            if evictable != self.pool.contains(id) {
                return Err(format!(
                    "{id:?} evictable={evictable} but pool membership differs"
                ));
            }
            if let Some(entry) = self.pool.get(id) {
                let held = self.blocks.get(id).map_or(info.bytes, |block| block.size);
                if (entry.held, entry.cost, entry.last_access)
                    != (held, info.cost, info.last_access)
                {
                    return Err(format!(
                        "{id:?} is in the pool as {entry:?}, not with its {held} B held, cost {} and last access {}",
                        info.cost, info.last_access
                    ));
                }
            }
            for &t in &info.tensors {
                if graph.tensors[t].defined && !info.is_resident() {
                    return Err(format!("{t:?} is defined over evicted {id:?}"));
                }
            }
        }
        self.pool.check_summaries()?;
        if constant_bytes != self.constant_bytes || constant_bytes > self.constant_peak_bytes {
            return Err(format!(
                "{constant_bytes} B of constants resident, {} B counted (peak {} B)",
                self.constant_bytes, self.constant_peak_bytes
            ));
        }
        if let Some(stray) = self
            .host_copies
            .keys()
            .find(|&&storage| !graph.storages.contains_key(storage))
        {
            return Err(format!("{stray:?} has a host copy but no storage"));
        }
        if host_bytes != self.host_bytes || host_bytes > self.host_peak_bytes {
            return Err(format!(
                "{host_bytes} B of host copies, {} B counted (peak {} B)",
                self.host_bytes, self.host_peak_bytes
            ));
        }
        let counter = self.counter();
        if resident_bytes != counter.in_use_bytes() {
            return Err(format!(
                "{resident_bytes} B resident but {} B accounted",
                counter.in_use_bytes()
            ));
        }
        if let Some(arena) = self.memory.arena() {
            if arena.report().in_use_bytes != resident_bytes {
                return Err(format!(
                    "the arena holds {} B, the storages {resident_bytes} B",
                    arena.report().in_use_bytes
                ));
            }
            // Each storage's block is where the arena has it (blocks move
            // in a compacting arena).
            let mut placed = 0usize;
            for piece in arena.pieces() {
                if let crate::memory::Piece::Used {
                    offset,
                    size,
                    owner: Some(owner),
                } = piece
                {
                    placed += 1;
                    if self.blocks.get(owner) != Some(&Block { offset, size }) {
                        return Err(format!(
                            "the arena has {owner:?} at {offset} ({size} B), the table at {:?}",
                            self.blocks.get(owner)
                        ));
                    }
                }
            }
            let sized = self.blocks.values().filter(|block| block.size > 0).count();
            if placed != sized {
                return Err(format!(
                    "the arena places {placed} storages, the table {sized}"
                ));
            }
        }
        if let Some(budget) = counter.budget_bytes() {
            if counter.in_use_bytes() > budget {
                return Err(format!(
                    "{} B in use over a budget of {budget} B",
                    counter.in_use_bytes()
                ));
            }
        }
        Ok(())
    }
}

/// The layout a storage of `bytes` is moved to host memory and back as: all
/// of its elements, in buffer order.
fn whole_storage(bytes: u64) -> Layout {
    Layout::contiguous(&[bytes.div_ceil(ELEMENT_BYTES) as usize])
}
