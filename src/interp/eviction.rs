//! Making room: the AutoEvict loop, eviction itself, and which storages are
//! candidates (resident, recomputable, unlocked, unpinned).

use super::{Event, Interpreter};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::{NodeId, Residency, StorageId};
use crate::policy::choose_victim;

/// What an allocation is for, to name it in an out-of-memory error.
#[derive(Clone, Copy)]
pub(super) enum RoomFor<'a> {
    Op(NodeId),
    Put(&'a [usize]),
}

impl<B: Backend> Interpreter<B> {
    /// Evicts by the heuristic until `bytes` more fit in the budget.
    /// Fails, evicting nothing, when even evicting every candidate would
    /// not be enough.
    pub(super) fn make_room(&mut self, bytes: u64, purpose: RoomFor<'_>) -> Result<()> {
        if self.memory.fits(bytes) {
            return Ok(());
        }
        let in_use = self.memory.in_use_bytes();
        let budget = self.memory.budget_bytes().unwrap_or(u64::MAX);
        if (in_use - self.pool.bytes()).saturating_add(bytes) > budget {
            return Err(self.out_of_memory(bytes, purpose));
        }
        while !self.memory.fits(bytes) {
            let victim = choose_victim(self.heuristic.as_mut(), &self.pool, &self.graph)
                .expect("the candidates' bytes cover the request");
            self.evict(victim, false);
        }
        Ok(())
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
        self.memory.free(bytes);
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
            self.pool.insert(storage, info.bytes);
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
        let in_use_bytes = self.memory.in_use_bytes();
        let locked_bytes: u64 = self
            .graph
            .storages
            .values()
            .filter(|s| s.is_resident() && s.locks > 0)
            .map(|s| s.bytes)
            .sum();
        let error = Error::OutOfMemory {
            context,
            requested_bytes,
            budget_bytes: self.memory.budget_bytes().unwrap_or(u64::MAX),
            in_use_bytes,
            locked_bytes,
            pinned_bytes: in_use_bytes.saturating_sub(self.pool.bytes() + locked_bytes),
        };
        tracing::warn!(target: "dtr::oom", %error);
        error
    }
}
