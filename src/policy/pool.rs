//! The eviction candidates: resident, recomputable, unlocked, unpinned
//! storages, kept in the order they became evictable.
//!
//! Order matters: the victim search keeps the *last* of equal scores, as the
//! DTR authors' simulator does, so ties break the same way on every run.

use slotmap::SecondaryMap;

use crate::graph::StorageId;

/// The storages that may be evicted now (resident, recomputable, unlocked,
/// unpinned), with their sizes, for scans and uniform random draws.
#[derive(Debug, Default)]
pub struct CandidatePool {
    /// Insertion order with holes left by removals, each with its size (so
    /// a random draw reads one array); compacted when holes dominate.
    entries: Vec<Option<(StorageId, u64)>>,
    /// Each member's position in `entries` and its size.
    members: SecondaryMap<StorageId, (usize, u64)>,
    bytes: u64,
}

impl CandidatePool {
    /// An empty pool.
    pub fn new() -> CandidatePool {
        CandidatePool::default()
    }

    /// How many candidates there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there is no candidate.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Total bytes of the candidates: what eviction could free at most.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `storage` is a candidate.
    pub fn contains(&self, storage: StorageId) -> bool {
        self.members.contains_key(storage)
    }

    /// Appends `storage` (no-op if present).
    pub fn insert(&mut self, storage: StorageId, bytes: u64) {
        if self.members.contains_key(storage) {
            return;
        }
        self.members.insert(storage, (self.entries.len(), bytes));
        self.entries.push(Some((storage, bytes)));
        self.bytes = self.bytes.saturating_add(bytes);
    }

    /// Removes `storage` (no-op if absent).
    pub fn remove(&mut self, storage: StorageId) {
        let Some((position, bytes)) = self.members.remove(storage) else {
            return;
        };
        self.entries[position] = None;
        self.bytes -= bytes;
        if self.entries.len() > 64 && self.entries.len() > 2 * self.members.len() {
            self.compact();
        }
    }

    /// A uniformly random candidate and its size. Holes are at most half
    /// of the entries (compaction keeps it so), so this takes two draws on
    /// average.
    pub fn random_member(&self, rng: &mut impl rand::Rng) -> Option<(StorageId, u64)> {
        if self.members.is_empty() {
            return None;
        }
        loop {
            if let Some(entry) = self.entries[rng.gen_range(0..self.entries.len())] {
                return Some(entry);
            }
        }
    }

    /// Candidates in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = StorageId> + '_ {
        self.entries.iter().flatten().map(|&(storage, _)| storage)
    }

    fn compact(&mut self) {
        self.entries.retain(Option::is_some);
        for (position, (storage, _)) in self.entries.iter().flatten().enumerate() {
            self.members[*storage].0 = position;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotmap::SlotMap;

    #[test]
    fn keeps_insertion_order_through_removals_and_compaction() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let ids: Vec<StorageId> = (0..200).map(|_| keys.insert(())).collect();
        let mut pool = CandidatePool::new();
        for &id in &ids {
            pool.insert(id, 2);
        }
        for &id in ids.iter().step_by(3) {
            pool.remove(id);
        }
        pool.insert(ids[0], 2);
        let expected: Vec<StorageId> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, id)| *id)
            .chain([ids[0]])
            .collect();
        assert_eq!(pool.iter().collect::<Vec<_>>(), expected);
        assert_eq!(pool.bytes(), 2 * expected.len() as u64);
        assert_eq!(pool.len(), expected.len());
    }
}
