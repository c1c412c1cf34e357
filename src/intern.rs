//! Values held once and shared (`Arc`) by the many records that repeat
//! them: the layouts of a graph's tensors, the output lists of a replay's
//! recorded ops. At millions of tensors a shared copy is what keeps each
//! record small.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

/// The distinct values in use, each held once.
#[derive(Debug)]
pub struct Interner<T: ?Sized> {
    /// Hashed with foldhash: the keys are op names and short lists, looked
    /// up once per op, where SipHash's cost showed in whole-run profiles.
    held: HashSet<Arc<T>, foldhash::fast::RandomState>,
    sweeps: Sweeps,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Interner<T> {
        Interner {
            held: HashSet::default(),
            sweeps: Sweeps::default(),
        }
    }
}

/// When a table of shared values drops the ones only it still holds: once
/// it has doubled since its last sweep, from 1024 entries on (amortised
/// O(1) per insertion).
#[derive(Debug, Default)]
pub(crate) struct Sweeps {
    at: usize,
}

impl Sweeps {
    /// Before an insertion into a table of `len` entries: when a sweep is
    /// due, runs `sweep`, which drops the unshared entries and answers how
    /// many are left.
    pub(crate) fn before_insert(&mut self, len: usize, sweep: impl FnOnce() -> usize) {
        if len >= self.at.max(1024) {
            self.at = 2 * sweep();
        }
    }
}

impl<T: ?Sized + Hash + Eq> Interner<T> {
    /// The held copy equal to `value`, or `make()`'s, now held. Copies only
    /// the interner holds are swept out once the set has doubled since the
    /// last sweep (amortised O(1) per call).
    pub fn get<Q>(&mut self, value: &Q, make: impl FnOnce() -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        if let Some(held) = self.find(value) {
            return held;
        }
        self.insert(make())
    }

    /// The held copy equal to `value`, if there is one.
    pub fn find<Q>(&self, value: &Q) -> Option<Arc<T>>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        self.held.get(value).cloned()
    }

    /// Holds `made`, a value not held yet (one [`Interner::find`] did not
    /// find: looking again would only cost a second probe).
    pub fn insert(&mut self, made: Arc<T>) -> Arc<T> {
        let held = &mut self.held;
        self.sweeps.before_insert(held.len(), || {
            held.retain(|v| Arc::strong_count(v) > 1);
            held.len()
        });
        self.held.insert(made.clone());
        made
    }

    /// Distinct values held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no value is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy_and_unused_ones_are_swept() {
        let mut interner: Interner<[u64]> = Interner::default();
        let a = interner.get(&[1u64, 2][..], || Arc::from(&[1u64, 2][..]));
        let b = interner.get(&[1u64, 2][..], || unreachable!("held already"));
        assert!(Arc::ptr_eq(&a, &b));
        for i in 0..5000u64 {
            interner.get(&[i][..], || Arc::from(&[i][..]));
        }
        // Only `[1, 2]` is held elsewhere; the rest go at sweeps.
        assert!(interner.len() < 3000);
        let c = interner.get(&[1u64, 2][..], || unreachable!("kept: still used"));
        assert!(Arc::ptr_eq(&a, &c));
    }
}
