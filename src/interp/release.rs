//! Dropping handles: `del`, eager eviction, and real frees.
//!
//! A tensor whose last handle is dropped is freed for real once nothing can
//! need it again: no live node reads it. Until then it stays as history so
//! its dependents can be recomputed, and its storage is evicted at once
//! when eager eviction is on and no view of it is still held. Out of
//! memory, a constant kept only as history may be freed by cutting the
//! history of the held tensors that read it.

use super::Interpreter;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::{NodeId, StorageId, TensorId};

/// The most evicted storages [`Interpreter::needed_by_evicted_live`] visits.
const NEEDED_WALK: usize = 64;

impl<B: Backend> Interpreter<B> {
    /// Drops one user handle to `tensor`.
    pub fn del(&mut self, tensor: TensorId) -> Result<()> {
        let info = self.live_tensor(tensor)?;
        if self.table.is_locked(info.storage) {
            return Err(Error::InvalidArgument(format!(
                "del: tensor {tensor:?} is in use by a running op"
            )));
        }
        self.observe(super::TensorInstruction::Del, tensor);
        let info = &mut self.graph.tensors[tensor];
        info.user_refs -= 1;
        if info.user_refs > 0 {
            return Ok(());
        }
        let (unneeded, storage) = (info.consumers.is_empty(), info.storage);
        if unneeded && !self.config.retain_history {
            self.free(tensor);
        } else if self.config.eager_eviction
            && !(self.config.keep_needed_history && self.needed_by_evicted_live(storage))
        {
            self.evict_if_unreferenced(storage);
        }
        self.resume_prefetch();
        self.prefetch();
        Ok(())
    }

    /// Whether recomputing some evicted tensor that the user still holds
    /// would read `storage`: a walk from its consumers' outputs through
    /// evicted storages (at most [`NEEDED_WALK`] of them; past that, it
    /// answers yes).
    fn needed_by_evicted_live(&self, storage: StorageId) -> bool {
        let graph = &self.graph;
        let mut seen: Vec<StorageId> = vec![storage];
        let mut stack: Vec<StorageId> = vec![storage];
        while let Some(s) = stack.pop() {
            for &t in &graph.storages[s].tensors {
                for node in graph.tensors[t].consumers.iter(&graph.nodes) {
                    for output in graph.nodes[node].live_outputs() {
                        let info = &graph.tensors[output];
                        if !graph.storages[info.storage].is_evicted()
                            || seen.contains(&info.storage)
                        {
                            continue;
                        }
                        if info.user_refs > 0 {
                            return true;
                        }
                        if seen.len() >= NEEDED_WALK {
                            return true;
                        }
                        seen.push(info.storage);
                        stack.push(info.storage);
                    }
                }
            }
        }
        false
    }

    /// Eager eviction: evicts `storage` if no view of it has a handle left
    /// (constants are left to the policy: they leave only by swap, which
    /// may wait for the copy queue).
    fn evict_if_unreferenced(&mut self, storage: StorageId) {
        let info = &self.graph.storages[storage];
        let unreferenced = info.recomputable
            && info
                .tensors
                .iter()
                .all(|&t| self.graph.tensors[t].user_refs == 0);
        if unreferenced && self.table.can_evict(&self.graph, storage) {
            self.evict(storage, true, None);
        }
    }

    /// Cuts `tensor`'s compute history: its value is materialised and it
    /// becomes a root like a put, never evicted or recomputed again. History
    /// that nothing else needs is freed. This is how a training loop keeps
    /// updated parameters without keeping every past step alive.
    pub fn detach(&mut self, tensor: TensorId) -> Result<()> {
        self.ensure_defined(tensor)?;
        self.lookahead_read(tensor);
        let info = &self.graph.tensors[tensor];
        let storage = info.storage;
        let (Some(node), k) = (info.producer, usize::from(info.output)) else {
            return Ok(());
        };
        if self.graph.storages[storage].tensors[0] != tensor {
            return Err(Error::InvalidArgument(format!(
                "detach: {tensor:?} is a view of another tensor's storage; detach a contiguous copy"
            )));
        }
        self.heuristic.on_graph_change(storage, &self.graph);
        self.graph.tensors[tensor].producer = None;
        let info = &mut self.graph.storages[storage];
        info.recomputable = false;
        self.refresh_storage_cost(storage);
        self.table.refresh_candidacy(&self.graph, storage);
        if self.table.host_copy_ready_at(storage).is_none() {
            self.queue_write_back(storage);
            self.write_back();
        }
        let mut unneeded = Vec::new();
        self.release_output(node, k, &mut unneeded);
        self.free_all(unneeded);
        self.observe(super::TensorInstruction::Detach, tensor);
        Ok(())
    }

    /// The last resort before running out of memory, under
    /// [`Config::free_constants_by_detaching`](crate::Config::free_constants_by_detaching):
    /// frees the largest constant that no handle holds but the history of
    /// held tensors still reads, by detaching the nearest held tensor on
    /// each path from it, when all of them are resident and those that
    /// could be evicted now (not in use by a running op) take fewer bytes
    /// than it: they never will be again. Returns whether one was freed.
    pub(super) fn free_a_constant_by_detaching(&mut self) -> bool {
        if !self.config.free_constants_by_detaching {
            return false;
        }
        let (graph, table) = (&self.graph, &self.table);
        let held = |t: TensorId| graph.tensors[t].user_refs > 0;
        let evictable_bytes = |t: TensorId| {
            let storage = graph.tensors[t].storage;
            if table.is_locked(storage) || table.is_pinned(storage) {
                0
            } else {
                graph.storages[storage].bytes
            }
        };
        // Detaching needs the value, and a storage's root: a view cannot be.
        let detachable = |t: TensorId| {
            graph.tensors[t].defined && graph.storages[graph.tensors[t].storage].tensors[0] == t
        };
        let mut best: Option<(StorageId, Vec<TensorId>)> = None;
        for (storage, info) in &graph.storages {
            let larger = best
                .as_ref()
                .is_none_or(|(chosen, _)| info.bytes > graph.storages[*chosen].bytes);
            if !larger
                || info.recomputable
                || !info.is_resident()
                || table.is_locked(storage)
                || table.is_pinned(storage)
                || info.tensors.iter().any(|&t| held(t))
            {
                continue;
            }
            let dependents = self.nearest_held_dependents(storage);
            let bytes = dependents.iter().map(|&t| evictable_bytes(t)).sum::<u64>();
            if !dependents.is_empty()
                && bytes < info.bytes
                && dependents.iter().all(|&t| detachable(t))
            {
                best = Some((storage, dependents));
            }
        }
        let Some((storage, dependents)) = best else {
            return false;
        };
        let bytes = self.graph.storages[storage].bytes;
        let _span = tracing::debug_span!(target: "dtr::evict", "free_constant", bytes).entered();
        for &dependent in &dependents {
            if self.detach(dependent).is_err() {
                break; // defined and a root, so this does not happen
            }
            self.backend.made_constant(dependent);
        }
        let freed = !self.graph.storages.contains_key(storage);
        tracing::debug!(target: "dtr::evict", bytes, detached = dependents.len(), freed, "freed a constant only history held");
        freed
    }

    /// Frees `tensor` (no handles, no consumers) and then every input that
    /// this leaves unneeded.
    pub(super) fn free(&mut self, tensor: TensorId) {
        self.free_all(vec![tensor]);
    }

    /// Frees the unneeded tensors, iteratively, and the inputs this leaves unneeded.
    fn free_all(&mut self, mut unneeded: Vec<TensorId>) {
        while let Some(tensor) = unneeded.pop() {
            // Told while the graph still has the tensor and its edges.
            self.heuristic
                .on_graph_change(self.graph.tensors[tensor].storage, &self.graph);
            let info = self
                .graph
                .tensors
                .remove(tensor)
                .expect("freed tensors are tracked");
            debug_assert!(info.user_refs == 0 && info.consumers.is_empty());
            self.detach_from_storage(tensor, info.storage);
            if let Some(node) = info.producer {
                self.release_output(node, usize::from(info.output), &mut unneeded);
            }
        }
    }

    /// Marks output `k` of `node` as gone. A node with no outputs left is
    /// removed, and inputs it leaves without handles or consumers are pushed
    /// to `unneeded`.
    fn release_output(&mut self, node: NodeId, k: usize, unneeded: &mut Vec<TensorId>) {
        self.graph.nodes[node].set_output(k, None);
        if self.graph.nodes[node]
            .outputs()
            .any(|output| output.is_some())
        {
            return; // siblings still need the node to be recomputed
        }
        let node_info = self.graph.nodes.remove(node).expect("producer is tracked");
        self.backend.forget(node_info.op());
        let inputs = node_info.inputs();
        for (i, &input) in inputs.iter().enumerate() {
            // A repeated input lists the node once.
            if inputs[..i].contains(&input) {
                continue;
            }
            let Some(input_info) = self.graph.tensors.get_mut(input) else {
                continue;
            };
            input_info.consumers.forget_removed(&self.graph.nodes);
            if input_info.user_refs == 0
                && input_info.consumers.is_empty()
                && !unneeded.contains(&input)
            {
                unneeded.push(input);
            }
        }
    }

    /// Removes `tensor` from its storage, freeing the storage with its last tensor.
    fn detach_from_storage(&mut self, tensor: TensorId, storage: StorageId) {
        let info = &mut self.graph.storages[storage];
        info.tensors.retain(|t| *t != tensor);
        if !info.tensors.is_empty() {
            self.refresh_storage_cost(storage);
            return;
        }
        self.heuristic.on_free(storage, &self.graph);
        self.forget_storage(storage);
    }

    /// Drops a storage with no tensors left from everything that tracks
    /// it: the graph, the storage table (its bytes and any host copy) and
    /// the copy queue.
    pub(super) fn forget_storage(&mut self, storage: StorageId) {
        self.graph
            .storages
            .remove(storage)
            .expect("storage is tracked");
        self.table.remove(storage, &mut self.backend);
        self.copies.forget(storage);
    }
}
