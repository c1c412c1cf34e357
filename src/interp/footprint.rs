//! The rematerialisation guard's measure: how many recomputable bytes
//! restoring an evicted storage would hold at once.
//!
//! Asked once per victim and walking the whole evicted region above it, so
//! it keeps its scratch space between calls (a generation-stamped memo
//! instead of a fresh hash map: on a long evicted chain, a recurrent
//! network's history, the map's hashing and growth were most of an
//! eviction) and stops as soon as the answer is known.

use slotmap::SecondaryMap;

use crate::graph::{Graph, NodeId, StorageId, TensorId};

/// Scratch space for [`RematFootprint::exceeds`].
#[derive(Default)]
pub(super) struct RematFootprint {
    /// Each node's footprint, valid where stamped with `generation`.
    memo: SecondaryMap<NodeId, (u32, u64)>,
    generation: u32,
    /// Pending ops: the op, its next input, the bytes its restored inputs
    /// hold, and its footprint so far.
    stack: Vec<(NodeId, usize, u64, u64)>,
}

impl RematFootprint {
    /// Whether rematerialising `storage` (were it evicted now) would hold
    /// more than `room` recomputable bytes at once, inputs and outputs,
    /// when it runs as [`materialize`](super::Interpreter::materialize)
    /// does: depth first, each op's inputs in order, every restored input
    /// locked until its op has run. So an op's footprint is the largest,
    /// over its missing inputs, of the bytes its earlier inputs hold plus
    /// that input's own footprint, and at least all its inputs and outputs
    /// together. Nothing else is evicted meanwhile, so it is a lower bound
    /// of what the rematerialisation needs (shared evicted ancestors count
    /// once per reader: an upper bound there).
    ///
    /// An op's footprint is at least that of every op it reruns, so the
    /// walk stops at the first op over `room`.
    pub(super) fn exceeds(&mut self, graph: &Graph, storage: StorageId, room: u64) -> bool {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.memo.clear();
            self.generation = 1;
        }
        let generation = self.generation;
        // The op to rerun for an input that would be missing, if any.
        let producer_of_missing = |input: TensorId| {
            let tensor = &graph.tensors[input];
            let missing = !tensor.defined || tensor.storage == storage;
            if missing {
                tensor.producer
            } else {
                None
            }
        };
        self.stack.clear();
        for &tensor in &graph.storages[storage].tensors {
            let Some(root) = graph.tensors[tensor].producer else {
                continue;
            };
            self.stack.push((root, 0, 0, 0));
            while let Some(&mut (node, ref mut next, ref mut held, ref mut peak)) =
                self.stack.last_mut()
            {
                let info = &graph.nodes[node];
                let inputs = info.inputs();
                if *next == inputs.len() {
                    let total = (*peak).max(held.saturating_add(info.signature().output_bytes()));
                    if total > room {
                        return true;
                    }
                    self.memo.insert(node, (generation, total));
                    self.stack.pop();
                    continue;
                }
                let input = inputs[*next];
                if let Some(producer) = producer_of_missing(input) {
                    match self.memo.get(producer) {
                        Some(&(stamp, restore)) if stamp == generation => {
                            *peak = (*peak).max(held.saturating_add(restore));
                        }
                        _ => {
                            self.stack.push((producer, 0, 0, 0));
                            continue;
                        }
                    }
                }
                let input_storage = graph.tensors[input].storage;
                let counted = inputs[..*next]
                    .iter()
                    .any(|&earlier| graph.tensors[earlier].storage == input_storage);
                if graph.storages[input_storage].recomputable && !counted {
                    *held = held.saturating_add(graph.storages[input_storage].bytes);
                }
                *next += 1;
            }
        }
        false
    }
}
