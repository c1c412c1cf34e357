//! Making room: the AutoEvict loop, eviction itself (the storage table
//! frees the bytes; this records it), and out-of-memory errors.

use smallvec::SmallVec;

use super::{steps, Interpreter, RunEvent};
use crate::backend::Backend;
use crate::config::RestoreMode;
use crate::error::{Error, Result};
use crate::graph::{NodeId, StorageId};
use crate::memory::{Block, Move};

/// What an allocation is for, to name it in an out-of-memory error.
#[derive(Clone, Copy)]
pub(super) enum RoomFor<'a> {
    /// A user's op, or (`rematerializing`) one re-run to restore an evicted tensor.
    Op {
        node: NodeId,
        rematerializing: bool,
    },
    Put(&'a [usize]),
    /// A buffer made outside dtr and adopted as a put (a foreign framework's
    /// tensor), of no shape dtr knows.
    Adopt,
    /// A constant (put or detached tensor) copied back from host memory.
    CopyBack,
}

impl<B: Backend> Interpreter<B> {
    /// Allocates a block for each of `sizes`, evicting as the policy
    /// chooses until they all fit. Fails, evicting nothing, when even
    /// evicting every candidate could not make them fit (unless, as a last
    /// resort, [freeing a constant only history
    /// holds](Interpreter::free_a_constant_by_detaching) makes room); fails after
    /// evicting when fragmentation leaves no room. With
    /// [`Config::remat_memory_guard`](crate::Config::remat_memory_guard), victims whose
    /// rematerialisation could not fit are held back while others remain.
    pub(super) fn reserve(&mut self, sizes: &[u64], purpose: RoomFor<'_>) -> Result<Vec<Block>> {
        if self.follows_plan() {
            return self.reserve_as_planned(sizes, purpose);
        }
        let requested = sizes.iter().fold(0u64, |sum, &b| sum.saturating_add(b));
        match self.reserve_by_step_plan(sizes, requested) {
            steps::Planned::No => {}
            steps::Planned::Room(blocks) => {
                self.step_request_done(requested, false);
                return Ok(blocks);
            }
            steps::Planned::OutOfMemory => {
                self.step_request_done(requested, true);
                return Err(self.out_of_memory(sizes, purpose));
            }
        }
        let mut held_back: Vec<StorageId> = Vec::new();
        let result = self.reserve_holding_back(sizes, purpose, &mut held_back);
        for storage in held_back {
            self.table.refresh_candidacy(&self.graph, storage);
        }
        self.schedule_reserved(result.is_err());
        self.step_request_done(requested, result.is_err());
        result
    }

    fn reserve_holding_back(
        &mut self,
        sizes: &[u64],
        purpose: RoomFor<'_>,
        held_back: &mut Vec<StorageId>,
    ) -> Result<Vec<Block>> {
        let mut guard = self.config.remat_memory_guard;
        // Moving blocks may take as long as the op that needs the room, no
        // longer: past that, evicting is the better bet. Once nothing can
        // be evicted, moving whatever it takes beats running out of memory.
        let movable = match purpose {
            RoomFor::Op { node, .. } => self.config.bytes_moved_in(self.graph.nodes[node].cost()),
            RoomFor::Put(_) | RoomFor::Adopt | RoomFor::CopyBack => 0,
        };
        // What a search found, refusals first: each is taken in turn at the
        // top of the loop, as a search per refusal would have found it,
        // unless the loop first takes another way.
        let mut found = crate::policy::Victims::default();
        let lasting = self.lasting_outputs(purpose);
        loop {
            if let Some(blocks) = self.table.reserve(sizes, &lasting) {
                return Ok(blocks);
            }
            if let Some(blocks) = self.reserve_by_moving(sizes, &lasting, movable) {
                return Ok(blocks);
            }
            let largest = sizes.iter().copied().max().unwrap_or(0);
            let request = self
                .table
                .memory()
                .arena()
                .and_then(|arena| arena.aligned(largest))
                .unwrap_or(largest);
            // Evicting cannot help when even evicting every candidate
            // would leave too few bytes. In an arena it cannot either when
            // no stretch of free and candidates' blocks is long enough:
            // then what the guard held back is a candidate again at once,
            // rather than after every other candidate was evicted for
            // nothing (without held-back candidates the loop goes on as
            // before: those evictions measured better than stopping).
            let stuck = self.table.pool().is_empty()
                || !self
                    .table
                    .memory()
                    .could_fit(sizes, self.table.unevictable_bytes())
                || (!held_back.is_empty() && !self.table.could_open_block(request));
            if stuck {
                if let Some(blocks) = self.reserve_by_moving(sizes, &lasting, u64::MAX) {
                    return Ok(blocks);
                }
            }
            if stuck {
                found = crate::policy::Victims::default();
            }
            if stuck && self.copy_out_a_constant() {
                continue;
            }
            if stuck && !held_back.is_empty() {
                // The last resort: what was held back is a candidate again
                // (under `swap` and `hybrid` one that leaves by copy: its
                // recomputation could not fit).
                guard = false;
                for storage in held_back.drain(..) {
                    self.leave_by_copy(storage);
                    self.table.refresh_candidacy(&self.graph, storage);
                }
                continue;
            }
            if stuck && self.free_a_constant_by_detaching() {
                continue;
            }
            if stuck {
                return Err(self.out_of_memory(sizes, purpose));
            }
            if found.refused.is_empty() && found.storages.is_empty() {
                found = self.choose_victims(request, guard);
            }
            if !found.refused.is_empty() {
                let victim = found.refused.remove(0);
                tracing::debug!(target: "dtr::evict", tensor = ?self.graph.storages[victim].tensors[0], "held back: its rematerialisation could not fit");
                self.table.hold_back(victim);
                held_back.push(victim);
                continue;
            }
            let victims = std::mem::take(&mut found);
            if victims.storages.is_empty() {
                return Err(self.out_of_memory(sizes, purpose));
            }
            for victim in victims.storages {
                if !self.table.pool().contains(victim) {
                    continue;
                }
                if guard && !victims.admitted && self.remat_could_not_fit(victim) {
                    tracing::debug!(target: "dtr::evict", tensor = ?self.graph.storages[victim].tensors[0], "held back: its rematerialisation could not fit");
                    self.table.hold_back(victim);
                    held_back.push(victim);
                    continue;
                }
                self.evict(victim, false, victims.score);
                self.step_victim(victim);
            }
        }
    }

    /// In a compacting arena whose free bytes would hold `sizes` but no
    /// free block does, moves blocks to open a hole and reserves it; the
    /// moves take their time on the compute stream.
    fn reserve_by_moving(
        &mut self,
        sizes: &[u64],
        lasting: &[bool],
        most_bytes: u64,
    ) -> Option<Vec<Block>> {
        let moves = self.table.make_room_by_moving(sizes, most_bytes)?;
        self.schedule_moves(&moves);
        self.charge_moves(&moves);
        self.table.reserve(sizes, lasting)
    }

    /// For an op's outputs, which of the blocks to reserve (one per output
    /// that is not a view) hold storages the program keeps (see
    /// [`StorageInfo::lasting`](crate::graph::StorageInfo::lasting));
    /// empty when none does, or when there is no arena to place them in.
    fn lasting_outputs(&self, purpose: RoomFor<'_>) -> SmallVec<[bool; 2]> {
        let RoomFor::Op { node, .. } = purpose else {
            return SmallVec::new();
        };
        if self.table.memory().arena().is_none() {
            return SmallVec::new();
        }
        let node = &self.graph.nodes[node];
        let marks: SmallVec<[bool; 2]> = (node.signature().outputs.iter().enumerate())
            .filter(|(_, output)| output.alias_of.is_none())
            .map(|(k, _)| {
                let tensor = node.output(k);
                tensor.is_some_and(|t| self.graph.storages[self.graph.tensors[t].storage].lasting)
            })
            .collect();
        if marks.contains(&true) {
            marks
        } else {
            SmallVec::new()
        }
    }

    /// Moved blocks take their time on the compute stream.
    pub(super) fn charge_moves(&mut self, moves: &[Move]) {
        let bytes = moves
            .iter()
            .fold(0u64, |sum, m| sum.saturating_add(m.to.size));
        if bytes > 0 {
            let cost = self.config.move_cost(bytes);
            self.graph.clock += cost;
            self.observers
                .notify(&RunEvent::Moved { bytes, cost }, &self.graph);
        }
    }

    /// Whether rematerialising `storage` (were it evicted now) would hold
    /// more recomputable bytes at once than the budget leaves beside the
    /// constants' high-water mark: see
    /// [`RematFootprint::exceeds`](super::footprint::RematFootprint::exceeds).
    fn remat_could_not_fit(&mut self, storage: StorageId) -> bool {
        let Some(room) = self.remat_room() else {
            return false;
        };
        self.footprint.exceeds(&self.graph, storage, room)
    }

    /// The bytes a rematerialisation may hold at once: the budget beside the
    /// most memory constants have held. `None` without a budget.
    pub(super) fn remat_room(&self) -> Option<u64> {
        let budget = self.table.counter().budget_bytes()?;
        Some(budget.saturating_sub(self.table.constant_peak_bytes()))
    }

    /// Frees a resident, evictable storage; its tensors become undefined
    /// and keep their compute paths.
    pub(super) fn evict(&mut self, storage: StorageId, eager: bool, score: Option<f64>) {
        let to_host = self.config.restore != RestoreMode::Drop && self.swap_out(storage, eager);
        self.table
            .evict(&mut self.graph, storage, &mut self.backend);
        if self.config.restore != RestoreMode::Drop {
            self.note_evicted(storage, to_host, eager);
        }
        if !eager {
            self.schedule_victim(self.graph.storages[storage].tensors[0]);
        }
        self.heuristic.on_evict(storage, &self.graph);
        let event = RunEvent::Evicted {
            storage,
            bytes: self.graph.storages[storage].bytes,
            score,
            eager,
            to_host,
        };
        self.observers.notify(&event, &self.graph);
    }

    pub(super) fn out_of_memory(&mut self, sizes: &[u64], purpose: RoomFor<'_>) -> Error {
        let requested_bytes = sizes.iter().fold(0u64, |sum, &b| sum.saturating_add(b));
        let arena = self.table.memory().arena();
        let aligned_bytes = arena.map_or(requested_bytes, |arena| {
            sizes.iter().fold(0u64, |sum, &b| {
                sum.saturating_add(arena.aligned(b).unwrap_or(u64::MAX))
            })
        });
        let largest_free_bytes = arena.map(|arena| arena.largest_free());
        let context = match purpose {
            RoomFor::Op {
                node,
                rematerializing,
            } => {
                let name = self.graph.nodes[node].op().name();
                if rematerializing {
                    format!("op `{name}`, rerun to rematerialise an evicted tensor,")
                } else {
                    format!("op `{name}`")
                }
            }
            RoomFor::Put(dims) => format!("put of shape {dims:?}"),
            RoomFor::Adopt => "buffer adopted from outside dtr".to_string(),
            RoomFor::CopyBack => "copy of a swapped-out constant back from host memory".to_string(),
        };
        let counter = self.table.counter();
        let in_use_bytes = counter.in_use_bytes();
        let locked_bytes = self.table.locked_bytes();
        let largest_locked = self
            .table
            .largest_locked(3)
            .into_iter()
            .map(|(storage, bytes)| {
                let root = self.graph.storages[storage].tensors[0];
                let what = match self.graph.tensors[root].producer {
                    Some(node) => {
                        format!("output of `{}`", self.graph.nodes[node].op().name())
                    }
                    None => "a put".to_string(),
                };
                (what, bytes)
            })
            .collect();
        let error = Error::OutOfMemory {
            context,
            requested_bytes,
            aligned_bytes,
            budget_bytes: counter.budget_bytes().unwrap_or(u64::MAX),
            in_use_bytes,
            locked_bytes,
            pinned_bytes: self.table.unevictable_bytes().saturating_sub(locked_bytes),
            largest_free_bytes,
            // Filled in by the rematerialisation that ran the op, if one did.
            chain: Vec::new(),
            largest_locked,
        };
        self.observers
            .notify(&RunEvent::OutOfMemory { error: &error }, &self.graph);
        error
    }
}
