//! A trace's tensor ids (any `u64`) mapped to dense [`TraceTensor`]s.
//!
//! Writers number tensors 0, 1, 2, … (or nearly so), so ids are kept in a
//! vector indexed by id while that vector stays within a constant factor of
//! the ids seen; an id far beyond that goes to a hash map instead. Memory
//! then follows the number of tensors, not the file's size or the largest id.

use std::collections::HashMap;

use super::TraceTensor;

/// No tensor at this index of the dense part.
const ABSENT: TraceTensor = TraceTensor::MAX;

#[derive(Debug, Default)]
pub(crate) struct TensorIds {
    /// `dense[id]`: the tensor of a small id, or [`ABSENT`].
    dense: Vec<TraceTensor>,
    /// The ids that did not fit `dense` when they were defined.
    sparse: HashMap<u64, TraceTensor, foldhash::fast::RandomState>,
    /// Ids defined.
    len: usize,
}

impl TensorIds {
    pub fn get(&self, id: u64) -> Option<TraceTensor> {
        let dense = usize::try_from(id)
            .ok()
            .and_then(|i| self.dense.get(i))
            .copied()
            .filter(|&t| t != ABSENT);
        dense.or_else(|| self.sparse.get(&id).copied())
    }

    pub fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Records a new id (the caller has checked that it is new). `tensor`
    /// must not be `TraceTensor::MAX`, which the builder never hands out
    /// (it counts tensors from 0 and stops at `MAX_TOTAL` bytes first).
    pub fn insert(&mut self, id: u64, tensor: TraceTensor) {
        self.len += 1;
        // Grow the vector only while it stays under twice the ids defined
        // (plus a little), so that a few huge ids cannot blow it up.
        let limit = 2 * self.len + 1024;
        match usize::try_from(id) {
            Ok(i) if i < self.dense.len() => self.dense[i] = tensor,
            Ok(i) if i < limit && tensor != ABSENT => {
                self.dense.resize(i + 1, ABSENT);
                self.dense[i] = tensor;
            }
            _ => {
                self.sparse.insert(id, tensor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_ids_resolve() {
        let mut ids = TensorIds::default();
        let all = [0u64, 1, 2, 5, 3, 1 << 40, u64::MAX, 4, 2000];
        for (t, &id) in all.iter().enumerate() {
            assert!(!ids.contains(id));
            ids.insert(id, t as TraceTensor);
        }
        for (t, &id) in all.iter().enumerate() {
            assert_eq!(ids.get(id), Some(t as TraceTensor), "id {id}");
        }
        assert_eq!(ids.get(6), None);
        assert_eq!(ids.get(1 << 41), None);
        assert!(ids.dense.len() < 2100, "huge ids stay out of the vector");
    }
}
