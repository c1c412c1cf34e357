//! Union-find over evicted storages, each class carrying the summed cost of
//! its members: the approximation of the evicted neighbourhood used by
//! `h_DTR_eq`. Classes only merge; a storage that becomes resident again
//! takes its cost out but leaves the class joined (a phantom dependency).

use std::collections::HashMap;

use foldhash::fast::RandomState;
use slotmap::SecondaryMap;

use crate::graph::StorageId;

/// An evicted storage's place in the classes: its node and the cost it
/// brought in. Packed to 12 bytes: the table keeps a slot for every storage.
#[derive(Debug, Clone, Copy)]
#[repr(C, packed(4))]
struct Member {
    node: u32,
    cost: u64,
}

/// The storages watching one class (see [`EqClasses::watch`]).
#[derive(Debug, Default)]
struct Watchers {
    storages: Vec<StorageId>,
    /// Their number after the last removal of duplicates: the list is
    /// deduplicated when it doubles, so a storage watching again and again
    /// keeps it short at an amortised O(log n) a watch.
    deduplicated: usize,
}

impl Watchers {
    fn push(&mut self, storage: StorageId) {
        self.storages.push(storage);
        if self.storages.len() >= 2 * self.deduplicated.max(4) {
            self.storages.sort_unstable();
            self.storages.dedup();
            self.deduplicated = self.storages.len();
        }
    }
}

#[derive(Debug, Default)]
pub struct EqClasses {
    parent: Vec<u32>,
    /// Members under each root, for union by size (shallow trees, so
    /// lookups stay fast without path compression on the read path).
    size: Vec<u32>,
    /// Summed cost; meaningful at roots.
    cost: Vec<u64>,
    /// Each evicted storage's node and the cost it brought in.
    members: SecondaryMap<StorageId, Member>,
    /// Bumped whenever compaction renames the nodes.
    generation: u64,
    /// By root, the storages to tell when the class's cost falls.
    watchers: HashMap<u32, Watchers, RandomState>,
}

impl EqClasses {
    /// The class root of an evicted storage.
    pub fn class_of(&self, storage: StorageId) -> Option<u32> {
        self.members
            .get(storage)
            .map(|member| self.root(member.node))
    }

    pub fn class_cost(&self, root: u32) -> u64 {
        self.cost[root as usize]
    }

    /// The node of an evicted storage: stable while it stays evicted and
    /// [`EqClasses::generation`] stays the same ([`EqClasses::root`] of it
    /// follows the merges).
    pub fn node_of(&self, storage: StorageId) -> Option<u32> {
        self.members.get(storage).map(|member| member.node)
    }

    /// Changes whenever nodes are renamed, so that nodes remembered under
    /// an older generation are known to be stale.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The root of `node`'s class.
    pub fn root(&self, mut node: u32) -> u32 {
        while self.parent[node as usize] != node {
            node = self.parent[node as usize];
        }
        node
    }

    /// Makes a singleton class for a newly evicted storage.
    pub fn insert(&mut self, storage: StorageId, cost: u64) {
        self.maybe_compact();
        let node = self.parent.len() as u32;
        self.parent.push(node);
        self.size.push(1);
        self.cost.push(cost);
        self.members.insert(storage, Member { node, cost });
    }

    /// Merges the classes of two evicted storages (no-op if already one).
    pub fn union(&mut self, a: StorageId, b: StorageId) {
        let (Some(ra), Some(rb)) = (self.class_of(a), self.class_of(b)) else {
            return;
        };
        if ra == rb {
            return;
        }
        let (big, small) = if self.size[ra as usize] >= self.size[rb as usize] {
            (ra, rb)
        } else {
            (rb, ra)
        };
        self.parent[small as usize] = big;
        self.size[big as usize] += self.size[small as usize];
        self.cost[big as usize] += self.cost[small as usize];
        if let Some(mut moved) = self.watchers.remove(&small) {
            let into = self.watchers.entry(big).or_default();
            if into.storages.len() < moved.storages.len() {
                std::mem::swap(into, &mut moved);
            }
            into.storages.append(&mut moved.storages);
            into.deduplicated += moved.deduplicated;
        }
    }

    /// Has `storage` told (by [`EqClasses::remove`]) when the cost of the
    /// class rooted at `root`, or of any class it merges into, falls.
    pub fn watch(&mut self, root: u32, storage: StorageId) {
        self.watchers.entry(root).or_default().push(storage);
    }

    /// Takes a storage out of its class (rematerialised or freed). When the
    /// class's cost falls, the storages watching it (some perhaps no
    /// longer adjacent, or twice) are appended to `lowered`, and forgotten.
    pub fn remove(&mut self, storage: StorageId, lowered: &mut Vec<StorageId>) {
        if let Some(Member { node, cost }) = self.members.remove(storage) {
            let root = self.root(node);
            self.cost[root as usize] = self.cost[root as usize].saturating_sub(cost);
            if cost > 0 {
                if let Some(watchers) = self.watchers.remove(&root) {
                    lowered.extend(watchers.storages);
                }
            }
        }
    }

    /// Nodes of departed members are never referenced by a lookup again;
    /// rebuild with one node per live class once they dominate, so memory
    /// follows the number of evicted storages, not the number of evictions.
    fn maybe_compact(&mut self) {
        if self.parent.len() < 1024 || self.parent.len() < 4 * self.members.len() {
            return;
        }
        let mut renamed: Vec<u32> = vec![u32::MAX; self.parent.len()];
        let (mut parent, mut size, mut cost) = (Vec::new(), Vec::new(), Vec::new());
        let roots: Vec<(StorageId, u32)> = self
            .members
            .iter()
            .map(|(s, member)| (s, self.root(member.node)))
            .collect();
        for (storage, root) in roots {
            if renamed[root as usize] == u32::MAX {
                renamed[root as usize] = parent.len() as u32;
                parent.push(parent.len() as u32);
                size.push(0);
                cost.push(self.cost[root as usize]);
            }
            let node = renamed[root as usize];
            size[node as usize] += 1;
            self.members[storage].node = node;
        }
        (self.parent, self.size, self.cost) = (parent, size, cost);
        // Classes left without members cost nothing: none falls further.
        self.watchers = std::mem::take(&mut self.watchers)
            .into_iter()
            .filter_map(|(root, watchers)| {
                let node = renamed[root as usize];
                (node != u32::MAX).then_some((node, watchers))
            })
            .collect();
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slotmap::SlotMap;

    /// Every storage has a slot in `members` (issue 17's memory target).
    #[test]
    fn a_member_stays_small() {
        assert_eq!(std::mem::size_of::<Member>(), 12);
    }

    #[test]
    fn merge_sums_and_remove_subtracts_without_splitting() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let (a, b, c) = (keys.insert(()), keys.insert(()), keys.insert(()));
        let mut classes = EqClasses::default();
        classes.insert(a, 3);
        classes.insert(b, 4);
        classes.insert(c, 5);
        classes.union(a, b);
        assert_eq!(classes.class_of(a), classes.class_of(b));
        assert_ne!(classes.class_of(a), classes.class_of(c));
        assert_eq!(classes.class_cost(classes.class_of(a).unwrap()), 7);
        classes.union(b, c);
        classes.remove(b, &mut Vec::new());
        assert_eq!(classes.class_of(b), None);
        assert_eq!(classes.class_of(a), classes.class_of(c));
        assert_eq!(classes.class_cost(classes.class_of(c).unwrap()), 8);
    }

    #[test]
    fn compaction_preserves_classes_and_costs() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let mut classes = EqClasses::default();
        let keep: Vec<StorageId> = (0..4).map(|_| keys.insert(())).collect();
        for (i, &s) in keep.iter().enumerate() {
            classes.insert(s, i as u64 + 1);
        }
        classes.union(keep[0], keep[1]);
        // Churn: many short-lived members force compaction.
        for _ in 0..5000 {
            let s = keys.insert(());
            classes.insert(s, 100);
            classes.union(s, keep[2]);
            classes.remove(s, &mut Vec::new());
        }
        assert!(
            classes.parent.len() < 2048,
            "nodes were not reclaimed: {}",
            classes.parent.len()
        );
        assert_eq!(classes.class_of(keep[0]), classes.class_of(keep[1]));
        assert_eq!(classes.class_cost(classes.class_of(keep[0]).unwrap()), 3);
        assert_eq!(classes.class_cost(classes.class_of(keep[2]).unwrap()), 3);
        assert_eq!(classes.class_cost(classes.class_of(keep[3]).unwrap()), 4);
    }
}
