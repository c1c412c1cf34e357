//! Making room: the AutoEvict loop, eviction itself, and which storages are
//! candidates (resident, recomputable, unlocked, unpinned).

use super::{Event, Interpreter};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::{NodeId, Residency, StorageId};
use crate::memory::Block;
use crate::policy::PolicyView;

/// What an allocation is for, to name it in an out-of-memory error.
#[derive(Clone, Copy)]
pub(super) enum RoomFor<'a> {
    Op(NodeId),
    Put(&'a [usize]),
}

impl<B: Backend> Interpreter<B> {
    /// Allocates a block for each of `sizes`, evicting as the policy
    /// chooses until they all fit. Fails, evicting nothing, when even
    /// evicting every candidate could not make them fit; fails after
    /// evicting when fragmentation leaves no room.
    pub(super) fn reserve(&mut self, sizes: &[u64], purpose: RoomFor<'_>) -> Result<Vec<Block>> {
        let requested = sizes.iter().fold(0u64, |sum, &b| sum.saturating_add(b));
        loop {
            if let Some(blocks) = self.memory.allocate_all(sizes) {
                return Ok(blocks);
            }
            let unevictable = self
                .memory
                .counter()
                .in_use_bytes()
                .saturating_sub(self.pool.bytes());
            if self.pool.is_empty() || !self.memory.could_fit(sizes, unevictable) {
                return Err(self.out_of_memory(requested, purpose));
            }
            let largest = sizes.iter().copied().max().unwrap_or(0);
            let request = self
                .memory
                .arena()
                .and_then(|arena| arena.aligned(largest))
                .unwrap_or(largest);
            let view = PolicyView {
                graph: &self.graph,
                memory: &self.memory,
                blocks: &self.blocks,
            };
            let victims = self
                .heuristic
                .choose(&self.pool, &view, request, &mut self.search);
            if victims.is_empty() {
                return Err(self.out_of_memory(requested, purpose));
            }
            for victim in victims {
                if self.pool.contains(victim) {
                    self.evict(victim, false);
                }
            }
        }
    }

    /// Frees a resident, evictable storage; its tensors become undefined
    /// and keep their compute paths.
    pub(super) fn evict(&mut self, storage: StorageId, eager: bool) {
        if let Some(buffer) = self.buffers.remove(storage) {
            self.backend.release(buffer);
        }
        let info = &mut self.graph.storages[storage];
        debug_assert!(
            info.recomputable && info.locks == 0 && info.pins == 0,
            "evicting a protected storage"
        );
        info.residency = Residency::Evicted;
        let (bytes, root) = (info.bytes, info.tensors[0]);
        for i in 0..self.graph.storages[storage].tensors.len() {
            let tensor = self.graph.storages[storage].tensors[i];
            self.graph.tensors[tensor].defined = false;
        }
        if let Some(block) = self.blocks.remove(storage) {
            self.memory.free(block);
        }
        self.pool.remove(storage);
        self.heuristic.on_evict(storage, &self.graph);
        self.stats.evictions += 1;
        if eager {
            self.stats.eager_evictions += 1;
        }
        tracing::debug!(target: "dtr::evict", tensor = ?root, bytes, eager, clock = self.graph.clock, "evicted");
        if self.config.record_events {
            self.events.push(Event::Evict {
                tensor: root,
                bytes,
                eager,
            });
        }
    }

    /// Puts a storage in or out of the candidate pool as its state says.
    pub(super) fn refresh_candidacy(&mut self, storage: StorageId) {
        let info = &self.graph.storages[storage];
        if info.is_resident() && info.recomputable && info.locks == 0 && info.pins == 0 {
            let held = self
                .blocks
                .get(storage)
                .map_or(info.bytes, |block| block.size);
            self.pool.insert(storage, held);
        } else {
            self.pool.remove(storage);
        }
    }

    pub(super) fn lock_storage(&mut self, storage: StorageId) {
        self.graph.storages[storage].locks += 1;
        self.pool.remove(storage);
    }

    pub(super) fn unlock_storage(&mut self, storage: StorageId) {
        self.graph.storages[storage].locks -= 1;
        self.refresh_candidacy(storage);
    }

    pub(super) fn pin_storage(&mut self, storage: StorageId) {
        self.graph.storages[storage].pins += 1;
        self.pool.remove(storage);
    }

    pub(super) fn unpin_storage(&mut self, storage: StorageId) {
        self.graph.storages[storage].pins -= 1;
        self.refresh_candidacy(storage);
    }

    fn out_of_memory(&self, requested_bytes: u64, purpose: RoomFor<'_>) -> Error {
        let context = match purpose {
            RoomFor::Op(node) => format!("op `{}`", self.graph.nodes[node].op.name()),
            RoomFor::Put(dims) => format!("put of shape {dims:?}"),
        };
        let in_use_bytes = self.memory.counter().in_use_bytes();
        let locked_bytes: u64 = self
            .graph
            .storages
            .iter()
            .filter(|(_, s)| s.is_resident() && s.locks > 0)
            .map(|(id, _)| self.blocks.get(id).map_or(0, |block| block.size))
            .sum();
        let error = Error::OutOfMemory {
            context,
            requested_bytes,
            budget_bytes: self.memory.counter().budget_bytes().unwrap_or(u64::MAX),
            in_use_bytes,
            locked_bytes,
            pinned_bytes: in_use_bytes.saturating_sub(self.pool.bytes() + locked_bytes),
        };
        tracing::warn!(target: "dtr::oom", %error);
        error
    }
}
