//! Making room: the AutoEvict loop, eviction itself (the storage table
//! frees the bytes; this records it), and out-of-memory errors.

use super::{Event, Interpreter};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::{NodeId, StorageId};
use crate::memory::Block;

/// What an allocation is for, to name it in an out-of-memory error.
#[derive(Clone, Copy)]
pub(super) enum RoomFor<'a> {
    /// A user's op, or (`rematerializing`) one re-run to restore an evicted tensor.
    Op {
        node: NodeId,
        rematerializing: bool,
    },
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
            if let Some(blocks) = self.table.reserve(sizes) {
                return Ok(blocks);
            }
            let memory = self.table.memory();
            if self.table.pool().is_empty()
                || !memory.could_fit(sizes, self.table.unevictable_bytes())
            {
                return Err(self.out_of_memory(requested, purpose));
            }
            let largest = sizes.iter().copied().max().unwrap_or(0);
            let request = memory
                .arena()
                .and_then(|arena| arena.aligned(largest))
                .unwrap_or(largest);
            let view = self.table.policy_view(&self.graph);
            let victims =
                self.heuristic
                    .choose(self.table.pool(), &view, request, &mut self.search);
            if victims.is_empty() {
                return Err(self.out_of_memory(requested, purpose));
            }
            for victim in victims {
                if self.table.pool().contains(victim) {
                    self.evict(victim, false);
                }
            }
        }
    }

    /// Frees a resident, evictable storage; its tensors become undefined
    /// and keep their compute paths.
    pub(super) fn evict(&mut self, storage: StorageId, eager: bool) {
        self.table
            .evict(&mut self.graph, storage, &mut self.backend);
        let info = &self.graph.storages[storage];
        let (bytes, root) = (info.bytes, info.tensors[0]);
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

    fn out_of_memory(&self, requested_bytes: u64, purpose: RoomFor<'_>) -> Error {
        let context = match purpose {
            RoomFor::Op {
                node,
                rematerializing,
            } => {
                let name = self.graph.nodes[node].op.name();
                if rematerializing {
                    format!("op `{name}`, rerun to rematerialise an evicted tensor,")
                } else {
                    format!("op `{name}`")
                }
            }
            RoomFor::Put(dims) => format!("put of shape {dims:?}"),
        };
        let counter = self.table.counter();
        let in_use_bytes = counter.in_use_bytes();
        let locked_bytes = self.table.locked_bytes();
        let error = Error::OutOfMemory {
            context,
            requested_bytes,
            budget_bytes: counter.budget_bytes().unwrap_or(u64::MAX),
            in_use_bytes,
            locked_bytes,
            pinned_bytes: self.table.unevictable_bytes().saturating_sub(locked_bytes),
        };
        tracing::warn!(target: "dtr::oom", %error);
        error
    }
}
