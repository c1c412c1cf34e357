//! Evicted regions: the evicted storages reachable from a storage through
//! evicted storages only, towards its descendants or its ancestors. Their
//! summed cost is what recomputing around the storage would add.

use slotmap::SecondaryMap;

use crate::graph::{Graph, StorageId};

/// Which way a region grows.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Through the outputs of the ops that read the storage's tensors.
    Descendants,
    /// Through the inputs of the ops that made them.
    Ancestors,
}

/// Walks regions with reusable scratch space (a generation-stamped visited set).
#[derive(Default)]
pub struct RegionWalker {
    visited: SecondaryMap<StorageId, u32>,
    generation: u32,
    stack: Vec<StorageId>,
}

impl RegionWalker {
    /// Summed `c0` of the evicted region around `base` in `direction`.
    pub fn cost(&mut self, graph: &Graph, base: StorageId, direction: Direction) -> u64 {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            self.visited.clear();
            self.generation = 1;
        }
        let generation = self.generation;
        let mut total = 0;
        self.stack.clear();
        self.stack.push(base);
        self.visited.insert(base, generation);
        while let Some(storage) = self.stack.pop() {
            for &tensor in &graph.storages[storage].tensors {
                let info = &graph.tensors[tensor];
                let mut visit = |next: StorageId| {
                    let evicted = !graph.storages[next].is_resident();
                    if evicted && self.visited.get(next) != Some(&generation) {
                        self.visited.insert(next, generation);
                        total += graph.storages[next].cost;
                        self.stack.push(next);
                    }
                };
                match direction {
                    Direction::Ancestors => {
                        if let Some((node, _)) = info.producer {
                            for &input in &graph.nodes[node].inputs {
                                visit(graph.tensors[input].storage);
                            }
                        }
                    }
                    Direction::Descendants => {
                        for &node in &info.consumers {
                            for &output in graph.nodes[node].outputs.iter().flatten() {
                                visit(graph.tensors[output].storage);
                            }
                        }
                    }
                }
            }
        }
        total
    }
}
