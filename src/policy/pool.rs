//! The eviction candidates: resident, recomputable, unlocked, unpinned
//! storages, kept in the order they became evictable.
//!
//! Order matters: the victim search keeps the *last* of equal scores, as the
//! DTR authors' simulator does, so ties break the same way on every run.
//!
//! Each candidate's entry also keeps what the DTR scores' common lower
//! bound `c0 / (m · stale)` needs (its cost, its bytes, its last access),
//! so a √N search reads one array entry per draw and the graph only for
//! the few candidates whose bound could beat the best score so far. The
//! interpreter keeps the entries equal to the graph's values
//! ([`CandidatePool::refresh`]), and its invariant check verifies it.

use std::collections::BTreeSet;
use std::ops::Bound;

use slotmap::SecondaryMap;

use super::summary::{Summaries, Summary};
use crate::graph::{StorageId, StorageInfo};

/// A lower bound of a heuristic's scores that a pool entry alone gives,
/// through a key that does not change with the clock: the pool can then
/// keep its candidates ordered by that key ([`CandidatePool::keep_order`])
/// and an exact search visit them in that order, stopping where no
/// remaining candidate's bound can beat the best score found (see
/// [`crate::policy::CandidateSearch::lowest_ordered`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolOrder {
    /// Scores are at least `(c0 + extra) / (held · stale)` (the DTR
    /// family), `extra` being what the heuristic last set through
    /// [`CandidatePool::bounds`] (0 by default): keyed by
    /// `(c0 + extra) / held`, and within equal keys by last access, oldest
    /// first.
    CostDensity,
    /// Scores are at least `c0 / held`, staleness aside (h_MSPS).
    CostPerByte,
    /// Scores are the last access itself (h_LRU).
    LastAccess,
    /// Scores are at least `1 / held` (h_size).
    InverseSize,
}

/// Key bits kept per bucket: the exponent and the two leading mantissa bits
/// of a non-negative `f64`, so a bucket spans a factor of at most 2^(1/4)
/// (their order is the order of the values).
const BUCKET_SHIFT: u32 = 50;

/// The bucket of a non-negative key (+∞ included).
fn bucket_of(key: f64) -> u32 {
    (key.to_bits() >> BUCKET_SHIFT) as u32
}

/// The least key of `bucket`: no key in it is smaller.
pub(super) fn bucket_floor(bucket: u32) -> f64 {
    f64::from_bits(u64::from(bucket) << BUCKET_SHIFT)
}

/// `numerator / held`, +∞ for no bytes (whose scores are +∞).
fn per_byte(numerator: u64, held: u64) -> f64 {
    if held == 0 {
        f64::INFINITY
    } else {
        numerator as f64 / held as f64
    }
}

/// One candidate's place in a [`PoolOrder`]: its key's bucket, its last
/// access, its position in the pool.
pub(super) type Place = (u32, u64, u32);

impl PoolOrder {
    fn place(self, candidate: &Candidate, extra: u64, position: u32) -> Place {
        let bucket = match self {
            PoolOrder::CostDensity => bucket_of(per_byte(
                candidate.cost.saturating_add(extra),
                candidate.held,
            )),
            PoolOrder::CostPerByte => bucket_of(per_byte(candidate.cost, candidate.held)),
            PoolOrder::LastAccess => 0,
            PoolOrder::InverseSize => bucket_of(per_byte(1, candidate.held)),
        };
        (bucket, candidate.last_access, position)
    }
}

/// The pool's candidates in a [`PoolOrder`].
#[derive(Debug)]
struct Ordered {
    order: PoolOrder,
    /// The pool size from which the order is kept: below it a plain scan
    /// is about as fast, and keeping the order would cost every change of
    /// candidacy a tree update for nothing.
    from: usize,
    /// The members' places, while the pool is large enough (built when it
    /// reaches `from`, dropped when it falls under half of it).
    places: Option<BTreeSet<Place>>,
}

/// One candidate as the pool keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The storage.
    pub storage: StorageId,
    /// Bytes it holds in memory (its block, never smaller than its size):
    /// what evicting it frees.
    pub held: u64,
    /// `c0`, as the graph has it.
    pub cost: u64,
    /// The logical clock of its last access, as the graph has it.
    pub last_access: u64,
}

impl Candidate {
    /// `c0 / (held · stale)` at `clock`, +∞ when the denominator is zero:
    /// never above the storage's own cost density `c0 / (m · stale)`
    /// (held ≥ m, and rounding is monotone), so never above the score of a
    /// heuristic whose scores are at least that.
    pub fn cost_density_bound(&self, clock: u64) -> f64 {
        let denominator = self.held as f64 * clock.saturating_sub(self.last_access) as f64;
        if denominator > 0.0 {
            self.cost as f64 / denominator
        } else {
            f64::INFINITY
        }
    }
}

/// The storages that may be evicted now (resident, recomputable, unlocked,
/// unpinned), for scans and uniform random draws.
#[derive(Debug, Default)]
pub struct CandidatePool {
    /// Insertion order with holes left by removals (so a random draw reads
    /// one array); compacted when holes dominate.
    entries: Vec<Option<Candidate>>,
    /// Each entry's [`Summary`], at the same positions: what √N draws read.
    /// Empty when not kept (see [`CandidatePool::keep_summaries`]).
    summaries: Summaries,
    /// Whether the summaries are not kept: a full scan never reads them.
    without_summaries: bool,
    /// Each member's position in `entries`.
    members: SecondaryMap<StorageId, u32>,
    bytes: u64,
    /// The members in a heuristic's order, when one is kept.
    ordered: Option<Ordered>,
    /// Each position's extra cost in its `(c0 + extra) / held` key (see
    /// [`Bounds`]), 0 past the end. Kept only while an order by that key
    /// or the summaries are (see [`CandidatePool::keeps_extras`]), so that
    /// a heuristic that stops maintaining them leaves none behind.
    extras: Vec<u64>,
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

    /// Where `storage` sits in insertion order (which breaks ties), if a
    /// member.
    pub fn position(&self, storage: StorageId) -> Option<u32> {
        self.members.get(storage).copied()
    }

    /// The extra cost in the key of `storage` (see [`Bounds`]): 0 unless it
    /// is a member and extras are kept.
    pub fn extra(&self, storage: StorageId) -> u64 {
        self.members
            .get(storage)
            .map_or(0, |&position| self.extra_at(position))
    }

    fn extra_at(&self, position: u32) -> u64 {
        self.extras.get(position as usize).copied().unwrap_or(0)
    }

    /// Whether keys' extras are kept: while the members are kept in
    /// [`PoolOrder::CostDensity`] order, or summarised for √N draws (whose
    /// bound counts them).
    fn keeps_extras(&self) -> bool {
        self.order() == Some(PoolOrder::CostDensity) || !self.without_summaries
    }

    /// Forgets every extra unless they are kept (see
    /// [`CandidatePool::keeps_extras`]): after the order or the summaries
    /// were dropped, no heuristic maintains them any more.
    fn drop_extras_unless_kept(&mut self) {
        if !self.keeps_extras() && !self.extras.is_empty() {
            self.extras = Vec::new();
            self.resummarize();
        }
    }

    /// The place of the member at `position`, whose entry is `candidate`,
    /// in the kept order (its current extra counted).
    fn place_of(&self, candidate: &Candidate, position: u32) -> Option<Place> {
        let ordered = self.ordered.as_ref()?;
        ordered.places.as_ref()?;
        Some(
            ordered
                .order
                .place(candidate, self.extra_at(position), position),
        )
    }

    /// The entry of `storage`, if it is a candidate.
    pub fn get(&self, storage: StorageId) -> Option<&Candidate> {
        let &position = self.members.get(storage)?;
        self.entries[position as usize].as_ref()
    }

    /// Appends `storage`, holding `held` bytes, with the cost and last
    /// access of `info`; a member keeps its place and gets them anew.
    pub fn insert(&mut self, storage: StorageId, held: u64, info: &StorageInfo) {
        // A block is never smaller than its storage; were it, a cost of 0
        // keeps the bound a bound (such an entry is always scored).
        let cost = if held >= info.bytes { info.cost } else { 0 };
        let candidate = Candidate {
            storage,
            held,
            cost,
            last_access: info.last_access,
        };
        if let Some(&position) = self.members.get(storage) {
            let entry = self.entries[position as usize]
                .as_mut()
                .expect("a member's entry");
            self.bytes = self.bytes - entry.held + held;
            let old = std::mem::replace(entry, candidate);
            let was = self.place_of(&old, position);
            // Its extra was set against the old held bytes: drop it.
            if let Some(extra) = self.extras.get_mut(position as usize) {
                *extra = 0;
            }
            self.summarize(position, Summary::of(&candidate, 0));
            self.reorder(position, was);
            return;
        }
        let position = u32::try_from(self.entries.len()).expect("fewer than 2³² entries");
        self.members.insert(storage, position);
        self.entries.push(Some(candidate));
        if !self.without_summaries {
            self.summaries.push(Summary::of(&candidate, 0));
        }
        self.bytes = self.bytes.saturating_add(held);
        if let Some(ordered) = &mut self.ordered {
            match &mut ordered.places {
                Some(places) => {
                    places.insert(ordered.order.place(&candidate, 0, position));
                }
                None if self.members.len() >= ordered.from => self.rebuild_order(),
                None => {}
            }
        }
    }

    /// Moves the member at `position`, which was at `was` in the kept
    /// order, to its entry's place now.
    fn reorder(&mut self, position: u32, was: Option<Place>) {
        let Some(was) = was else {
            return;
        };
        let new = *self.at(position);
        let is = self.place_of(&new, position).expect("kept places");
        if was != is {
            let places = (self.ordered.as_mut())
                .and_then(|ordered| ordered.places.as_mut())
                .expect("kept places");
            places.remove(&was);
            places.insert(is);
        }
    }

    /// Gives the member at `position`, whose entry is `candidate`, the
    /// extra cost `extra` in its key (no-op unless extras are kept).
    fn set_extra_at(&mut self, position: u32, candidate: &Candidate, extra: u64) {
        if !self.keeps_extras() || self.extra_at(position) == extra {
            return;
        }
        let was = self.place_of(candidate, position);
        let slot = position as usize;
        if self.extras.len() <= slot {
            self.extras.resize(slot + 1, 0);
        }
        self.extras[slot] = extra;
        self.summarize(position, Summary::of(candidate, extra));
        self.reorder(position, was);
    }

    /// The handle through which a heuristic sets the extra costs of
    /// [`PoolOrder::CostDensity`] keys.
    pub fn bounds(&mut self) -> Bounds<'_> {
        Bounds { pool: self }
    }

    /// Keeps the members in `order` from now on (`None`: in none), for
    /// [`crate::policy::CandidateSearch::lowest_ordered`], while the pool
    /// holds at least `from` candidates (0: always).
    pub fn keep_order(&mut self, order: Option<PoolOrder>, from: usize) {
        self.ordered = order.map(|order| Ordered {
            order,
            from,
            places: None,
        });
        if self.members.len() >= from {
            self.rebuild_order();
        }
        self.drop_extras_unless_kept();
    }

    /// The order the members are kept in, if one is kept now.
    pub fn order(&self) -> Option<PoolOrder> {
        self.ordered
            .as_ref()
            .filter(|ordered| ordered.places.is_some())
            .map(|ordered| ordered.order)
    }

    /// The members' places in their order from `from` on (nothing when no
    /// order is kept).
    pub(super) fn places_from(&self, from: Place) -> impl Iterator<Item = &Place> + '_ {
        self.ordered
            .iter()
            .flat_map(|ordered| &ordered.places)
            .flat_map(move |places| places.range((Bound::Included(from), Bound::Unbounded)))
    }

    /// The entry at `position` of [`CandidatePool::entries`].
    pub(super) fn at(&self, position: u32) -> &Candidate {
        self.entries[position as usize]
            .as_ref()
            .expect("an ordered member's entry")
    }

    /// `(c0 + extra) / (held · stale)` of the member at `position` at
    /// `clock`, +∞ when the denominator is zero: as
    /// [`Candidate::cost_density_bound`], never above a score that is at
    /// least the key's numerator over `m · stale`.
    pub(super) fn key_bound(&self, position: u32, clock: u64) -> f64 {
        let candidate = self.at(position);
        let extra = self.extra_at(position);
        let denominator =
            candidate.held as f64 * clock.saturating_sub(candidate.last_access) as f64;
        if denominator > 0.0 {
            candidate.cost.saturating_add(extra) as f64 / denominator
        } else {
            f64::INFINITY
        }
    }

    /// Builds the members' places anew (after a compaction moved them and
    /// their extras, or when the pool grew large enough to keep them).
    fn rebuild_order(&mut self) {
        if let Some(ordered) = &mut self.ordered {
            let extras = &self.extras;
            let places = (self.entries.iter().enumerate())
                .filter_map(|(position, entry)| {
                    let extra = extras.get(position).copied().unwrap_or(0);
                    entry.map(|candidate| ordered.order.place(&candidate, extra, position as u32))
                })
                .collect();
            ordered.places = Some(places);
        }
    }

    /// Summarises every entry anew (after the extras changed wholesale).
    fn resummarize(&mut self) {
        if !self.without_summaries {
            let extras = &self.extras;
            self.summaries = (self.entries.iter().enumerate())
                .map(|(position, entry)| {
                    let extra = extras.get(position).copied().unwrap_or(0);
                    entry
                        .as_ref()
                        .map_or(Summary::HOLE, |c| Summary::of(c, extra))
                })
                .collect();
        }
    }

    /// Gives a member's entry the cost and last access of `info` (no-op
    /// for a storage that is not a candidate).
    pub fn refresh(&mut self, storage: StorageId, info: &StorageInfo) {
        if let Some(&position) = self.members.get(storage) {
            let entry = self.entries[position as usize]
                .as_mut()
                .expect("a member's entry");
            let old = *entry;
            entry.cost = if entry.held >= info.bytes {
                info.cost
            } else {
                0
            };
            entry.last_access = info.last_access;
            let new = *entry;
            let summary = Summary::of(&new, self.extra_at(position));
            let was = self.place_of(&old, position);
            self.summarize(position, summary);
            self.reorder(position, was);
        }
    }

    /// Removes `storage` (no-op if absent).
    pub fn remove(&mut self, storage: StorageId) {
        let Some(position) = self.members.remove(storage) else {
            return;
        };
        let was = self.place_of(self.at(position), position);
        let entry = self.entries[position as usize]
            .take()
            .expect("a member's entry");
        self.summarize(position, Summary::HOLE);
        self.bytes -= entry.held;
        if let Some(extra) = self.extras.get_mut(position as usize) {
            *extra = 0;
        }
        if let (Some(ordered), Some(was)) = (&mut self.ordered, was) {
            if self.members.len() < ordered.from / 2 {
                ordered.places = None;
                self.drop_extras_unless_kept();
            } else {
                ordered.places.as_mut().expect("kept places").remove(&was);
            }
        }
        if self.entries.len() > 64 && self.entries.len() > 2 * self.members.len() {
            self.compact();
        }
    }

    /// The entries, holes included, for uniform draws: holes are at most
    /// half of them (compaction keeps it so), so a draw of a member takes
    /// two draws of an entry on average.
    pub fn entries(&self) -> &[Option<Candidate>] {
        &self.entries
    }

    /// The [`Summary`] of each of [`CandidatePool::entries`], at the same
    /// positions; empty when they are not kept.
    pub fn summaries(&self) -> &Summaries {
        &self.summaries
    }

    /// Keeps the summaries (the default) or not. Only √N draws read them,
    /// and keeping them costs every insert, refresh and removal a little:
    /// 2% of a Transformer log's replay, which scans the whole pool.
    pub fn keep_summaries(&mut self, keep: bool) {
        self.without_summaries = !keep;
        self.summaries = Summaries::default();
        self.drop_extras_unless_kept();
        self.resummarize();
    }

    fn summarize(&mut self, position: u32, summary: Summary) {
        if !self.without_summaries {
            self.summaries.set(position as usize, summary);
        }
    }

    /// Whether every summary is its entry's (or none is kept), for
    /// invariant checks.
    pub fn check_summaries(&self) -> Result<(), String> {
        if self.without_summaries {
            return match self.summaries.is_empty() {
                true => Ok(()),
                false => Err("pool summaries kept while turned off".into()),
            };
        }
        if self.summaries.len() != self.entries.len() {
            return Err(format!(
                "{} pool summaries for {} entries",
                self.summaries.len(),
                self.entries.len()
            ));
        }
        if !self.keeps_extras() && !self.extras.is_empty() {
            return Err("pool extras kept with neither order nor summaries".into());
        }
        for (position, (entry, summary)) in
            self.entries.iter().zip(self.summaries.iter()).enumerate()
        {
            let extra = self.extra_at(position as u32);
            let expected = entry
                .as_ref()
                .map_or(Summary::HOLE, |c| Summary::of(c, extra));
            if summary != expected {
                return Err(format!(
                    "pool position {position} is summarised as {summary:?}, not {expected:?}"
                ));
            }
        }
        Ok(())
    }

    /// Candidates in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = &Candidate> + '_ {
        self.entries.iter().flatten()
    }

    fn compact(&mut self) {
        // Holes have no extra (removals zero it): keep the members'.
        let mut position = 0;
        self.extras.retain(|_| {
            position += 1;
            self.entries[position - 1].is_some()
        });
        self.entries.retain(Option::is_some);
        self.summaries = (self.summaries.iter())
            .filter(|summary| !summary.is_hole())
            .collect();
        for (position, candidate) in self.entries.iter().flatten().enumerate() {
            self.members[candidate.storage] = position as u32;
        }
        if self.order().is_some() {
            self.rebuild_order();
        }
    }
}

/// What a heuristic may change in a [`CandidatePool`]: the extra cost
/// counted in each member's `(c0 + extra) / held` key, by which the
/// [`PoolOrder::CostDensity`] order sorts and the √N draws' [`Summary`]
/// bounds prune. It must stay a lower bound of what the heuristic's score
/// adds to `c0` (else a search passes over a candidate it should choose).
/// A member gets 0 when it enters the pool and whenever neither the places
/// nor the summaries are kept; the heuristic raises it after scoring the
/// member and must lower it again before the next search wherever the
/// added cost can fall.
pub struct Bounds<'a> {
    pool: &'a mut CandidatePool,
}

impl Bounds<'_> {
    /// Whether the pool keeps places by [`PoolOrder::CostDensity`] keys,
    /// or summaries, now: only then are extras kept, and worth maintaining.
    pub fn kept(&self) -> bool {
        self.pool.keeps_extras()
    }

    /// Counts `extra` beside `c0` in the key of `storage`, a storage of
    /// `bytes` bytes (no-op unless it is a member and extras are kept; an
    /// entry whose block is smaller than its storage, whose key counts no
    /// cost, counts no extra either).
    pub fn set(&mut self, storage: StorageId, extra: u64, bytes: u64) {
        let Some(&position) = self.pool.members.get(storage) else {
            return;
        };
        let candidate = self.pool.at(position);
        let extra = if candidate.held >= bytes { extra } else { 0 };
        let candidate = *candidate;
        self.pool.set_extra_at(position, &candidate, extra);
    }

    /// Sets every member's extra to 0.
    pub fn clear(&mut self) {
        if self.pool.extras.iter().any(|&extra| extra > 0) {
            self.pool.extras = Vec::new();
            if self.pool.order().is_some() {
                self.pool.rebuild_order();
            }
            self.pool.resummarize();
        }
    }

    /// How many members there are.
    pub fn members(&self) -> usize {
        self.pool.len()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::graph::Residency;
    use crate::policy::BoundClock;
    use slotmap::SlotMap;

    /// A storage's graph record with these bytes, cost and last access.
    pub(in crate::policy) fn info(bytes: u64, cost: u64, last_access: u64) -> StorageInfo {
        StorageInfo {
            bytes,
            tensors: Default::default(),
            residency: Residency::Resident,
            last_access,
            cost,
            recomputable: true,
            lasting: false,
        }
    }

    #[test]
    fn keeps_insertion_order_through_removals_and_compaction() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let ids: Vec<StorageId> = (0..200).map(|_| keys.insert(())).collect();
        let mut pool = CandidatePool::new();
        for &id in &ids {
            pool.insert(id, 2, &info(2, 1, 1));
        }
        for &id in ids.iter().step_by(3) {
            pool.remove(id);
        }
        pool.insert(ids[0], 2, &info(2, 1, 1));
        let expected: Vec<StorageId> = ids
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, id)| *id)
            .chain([ids[0]])
            .collect();
        let order: Vec<StorageId> = pool.iter().map(|c| c.storage).collect();
        assert_eq!(order, expected);
        assert_eq!(pool.bytes(), 2 * expected.len() as u64);
        assert_eq!(pool.len(), expected.len());
        for &id in &expected {
            assert_eq!(pool.get(id).map(|c| c.storage), Some(id));
        }
    }

    #[test]
    fn entries_follow_the_graph_in_place() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let (a, b) = (keys.insert(()), keys.insert(()));
        let mut pool = CandidatePool::new();
        pool.insert(a, 8, &info(6, 5, 3));
        pool.insert(b, 4, &info(4, 1, 1));
        pool.refresh(a, &info(6, 7, 9));
        let expected = Candidate {
            storage: a,
            held: 8,
            cost: 7,
            last_access: 9,
        };
        assert_eq!(pool.get(a), Some(&expected));
        // Inserting a member again updates it where it stands.
        pool.insert(a, 16, &info(6, 7, 9));
        assert_eq!(
            pool.iter().next().map(|c| (c.storage, c.held)),
            Some((a, 16))
        );
        assert_eq!(pool.bytes(), 20);
        // Refreshing a storage outside the pool adds nothing.
        pool.remove(b);
        pool.refresh(b, &info(4, 1, 1));
        assert!(!pool.contains(b));
        assert_eq!(pool.bytes(), 16);
    }

    /// The summaries follow the entries: holes where members left, none
    /// while turned off, and keys' extras counted.
    #[test]
    fn summaries_follow_the_entries() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let s = keys.insert(());
        let mut pool = CandidatePool::new();
        let t = keys.insert(());
        pool.insert(s, 8, &info(8, 3, 1));
        pool.insert(t, 8, &info(8, 3, 1));
        pool.remove(s);
        assert!(pool.summaries().get(0).is_hole() && !pool.summaries().get(1).is_hole());
        assert_eq!(pool.check_summaries(), Ok(()));
        // Turned off, none are kept; turned on again, they are the entries'.
        pool.keep_summaries(false);
        pool.insert(s, 16, &info(16, 5, 2));
        pool.refresh(t, &info(8, 4, 3));
        assert!(pool.summaries().is_empty());
        assert_eq!(pool.check_summaries(), Ok(()));
        pool.keep_summaries(true);
        assert_eq!(pool.summaries().len(), pool.entries().len());
        assert_eq!(pool.check_summaries(), Ok(()));
        // An extra set through the bounds raises the summary's bound, and
        // goes when the summaries do (no heuristic maintains it then).
        let plain = pool
            .summaries()
            .get(1)
            .cost_density_bound(BoundClock::new(10));
        pool.bounds().set(t, 40, 8);
        assert_eq!(pool.extra(t), 40);
        assert!(
            pool.summaries()
                .get(1)
                .cost_density_bound(BoundClock::new(10))
                > plain
        );
        assert_eq!(pool.check_summaries(), Ok(()));
        pool.keep_summaries(false);
        assert_eq!(pool.extra(t), 0);
        assert_eq!(pool.check_summaries(), Ok(()));
    }

    #[test]
    fn the_bound_is_the_cost_density_and_never_above_it() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let s = keys.insert(());
        let candidate = |held, cost, last_access| Candidate {
            storage: s,
            held,
            cost,
            last_access,
        };
        assert_eq!(candidate(4, 6, 7).cost_density_bound(10), 0.5);
        // A larger block only lowers it.
        assert!(candidate(8, 6, 7).cost_density_bound(10) < 0.5);
        // Accessed now, or of no bytes: +∞, as the scores have it.
        assert_eq!(candidate(4, 6, 10).cost_density_bound(10), f64::INFINITY);
        assert_eq!(candidate(0, 6, 7).cost_density_bound(10), f64::INFINITY);
        // A block smaller than its storage (none is) keeps a bound of 0.
        let mut pool = CandidatePool::new();
        pool.insert(s, 2, &info(4, 6, 7));
        assert_eq!(pool.get(s).unwrap().cost_density_bound(10), 0.0);
    }
}
