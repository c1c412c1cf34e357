//! Finding the lowest score among the candidates: a full scan, or √N of
//! them drawn at random (the DTR prototype's search), seeded.

use rand::{Rng, SeedableRng};

use super::pool::{bucket_floor, Candidate, Place, PoolOrder};
use super::summary::{BoundClock, HeldThreshold, PER_LINE};
use super::CandidatePool;
use crate::graph::StorageId;

/// Which candidates a victim search scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Sampling {
    /// Every candidate.
    #[default]
    All,
    /// ⌈√N⌉ candidates drawn uniformly (with replacement), ignoring those
    /// under 1% of the average candidate size. In large pools they are
    /// drawn in aligned blocks of up to 8 neighbouring pool positions (one
    /// cache line of summaries), each position still as likely as any
    /// other.
    Sqrt,
}

impl std::fmt::Display for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sampling::All => "all",
            Sampling::Sqrt => "sqrt",
        })
    }
}

/// Draws kept ahead of the one being scored, their summaries prefetched,
/// so that this many cache misses overlap instead of following one another
/// (8, 16 and 32 measured alike once a draw reads one line).
const WINDOW: usize = 8;

/// How many neighbouring pool positions one √N draw takes, for a search
/// that wants `wanted` candidates: one, as the DTR prototype draws, until
/// a sample would have 128 draws or more (pools past 16,000 candidates),
/// then the largest power of two that leaves at least 64 draws, at most
/// 8. At 10⁶ candidates the pool is far larger than the cache and every
/// draw is a miss: a draw takes an aligned block of positions (a uniform
/// block index times the run), whose eight summaries fill one cache line
/// (see [`super::Summaries`]), so the 1,000 candidates cost 125 misses
/// instead of 1,000. Each position is still drawn as often as any other
/// (it lies in exactly one block); the blocks are what is less random,
/// and at 64 or more of them the sample still spans the pool. The
/// authors' logs (a few thousand candidates at most) draw one at a time,
/// as before.
pub(crate) fn run_length(wanted: usize) -> usize {
    let most = (wanted / 64).clamp(1, super::summary::PER_LINE);
    1 << most.ilog2()
}

/// Starts bringing `value` into the cache, without waiting for it.
#[inline(always)]
pub(super) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64, and a prefetch is a hint that reads
    // nothing and cannot fault.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Prefetches the cache lines of `items[range]`: one prefetch per line,
/// not per item.
#[inline(always)]
fn prefetch_range<T>(items: &[T], range: std::ops::Range<usize>) {
    let per_line = (64 / std::mem::size_of::<T>().max(1)).max(1);
    let Some(last) = range.end.checked_sub(1) else {
        return;
    };
    for slot in range.step_by(per_line) {
        prefetch(&items[slot]);
    }
    // The last line, where the range does not start on a line's start.
    prefetch(&items[last]);
}

/// The draws whose scoring waits for the second pass of
/// [`CandidateSearch::lowest_sampled`]: each one's bound, and its pool
/// position and index among the sampled draws, in the order drawn.
#[derive(Debug, Clone, Default)]
struct DeferredDraws {
    bounds: Vec<f64>,
    draws: Vec<(u32, u32)>,
}

impl DeferredDraws {
    fn clear(&mut self) {
        self.bounds.clear();
        self.draws.clear();
    }

    fn push(&mut self, bound: f64, position: usize, index: u32) {
        self.bounds.push(bound);
        self.draws.push((position as u32, index));
    }

    /// Defers the `lanes` of line `line` (their `bounds`), the draws after
    /// the `base`th. Every lane takes a place, so that a whole line is
    /// copied at once; the others' bounds are NaN, which is never the
    /// lowest nor at most anything.
    #[inline(always)]
    fn push_line(&mut self, bounds: [f64; PER_LINE], lanes: u8, line: usize, base: u32) {
        let first = (line * PER_LINE) as u32;
        if lanes == u8::MAX {
            let draws: [(u32, u32); PER_LINE] =
                std::array::from_fn(|lane| (first + lane as u32, base + lane as u32 + 1));
            self.bounds.extend_from_slice(&bounds);
            self.draws.extend_from_slice(&draws);
            return;
        }
        let mut masked = [f64::NAN; PER_LINE];
        let mut draws = [(0, 0); PER_LINE];
        let mut index = base;
        for lane in 0..PER_LINE {
            let deferred = (lanes >> lane) & 1;
            index += u32::from(deferred);
            if deferred != 0 {
                masked[lane] = bounds[lane];
            }
            draws[lane] = (first + lane as u32, index);
        }
        self.bounds.extend_from_slice(&masked);
        self.draws.extend_from_slice(&draws);
    }

    /// Pads the draws to whole chunks of [`PER_LINE`] with NaN bounds, so
    /// that [`DeferredDraws::chunks`] covers them all.
    fn pad(&mut self) {
        while !self.bounds.len().is_multiple_of(PER_LINE) {
            self.push(f64::NAN, 0, 0);
        }
    }

    /// The bounds (after [`DeferredDraws::pad`]) in chunks of eight.
    fn chunks(&self) -> &[[f64; PER_LINE]] {
        self.bounds.as_chunks().0
    }

    /// The first of the lowest bounds (after [`DeferredDraws::pad`]): its
    /// draw's place in the order drawn.
    fn lowest(&self) -> Option<usize> {
        // Lane-wise minima first (the compiler keeps them in vector
        // registers), then the first bound that is the lowest; `min`
        // passes NaN over.
        let mut lows = [f64::INFINITY; PER_LINE];
        for chunk in self.chunks() {
            for (low, &bound) in lows.iter_mut().zip(chunk) {
                *low = low.min(bound);
            }
        }
        let lowest = lows.iter().fold(f64::INFINITY, |a, &b| a.min(b));
        // The first chunk holding it, eight comparisons at once.
        (self.chunks().iter().enumerate()).find_map(|(chunk_index, chunk)| {
            let lanes = at_most(chunk, lowest);
            (lanes != 0).then(|| chunk_index * PER_LINE + lanes.trailing_zeros() as usize)
        })
    }
}

/// The lanes of `chunk` at most `best`, lane `i` in bit `i` (NaN never
/// is): vector comparisons, their signs gathered into a mask.
fn at_most(chunk: &[f64; PER_LINE], best: f64) -> u8 {
    let mut lanes = 0;
    for (lane, &bound) in chunk.iter().enumerate() {
        lanes |= u8::from(bound <= best) << lane;
    }
    lanes
}

/// The √N search's generator: xoshiro256++ (Blackman and Vigna), seeded
/// through SplitMix64. About 1 ns a draw where `StdRng` (ChaCha12) took
/// about 4, a fifth of a search at 10⁶ candidates; statistical quality is
/// ample for drawing candidates, and no secrecy is wanted. Named, unlike
/// `rand`'s `SmallRng` (documented to change between versions and
/// platforms), so a seed's draws, and so its decisions, stay what they are.
pub(crate) type SearchRng = rand_xoshiro::Xoshiro256PlusPlus;

/// The victim search with its own seeded generator.
#[derive(Debug, Clone)]
pub struct CandidateSearch {
    sampling: Sampling,
    rng: SearchRng,
    /// Scratch for [`CandidateSearch::lowest_ordered`]: each bucket's
    /// lowest bound and first place.
    buckets: Vec<(f64, Place)>,
    /// The share of the pool the last ordered searches visited, averaged.
    ordered_share: f64,
    /// Searches by [`CandidateSearch::lowest_exact`] so far.
    searches: u64,
    /// The share of √N draws whose entry was read (their bound did not rule
    /// them out), averaged over the last searches.
    entry_share: f64,
    /// Scratch for [`CandidateSearch::lowest_sampled`].
    deferred: DeferredDraws,
    /// Scratch for [`lowest_scoring`](super::lowest_scoring): the
    /// candidates' lower bounds, in pool order.
    bounds: Vec<(f64, StorageId)>,
}

impl CandidateSearch {
    /// Which candidates it scores.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// An empty list for lower bounds, reusing the last one's room.
    pub(crate) fn take_bounds(&mut self) -> Vec<(f64, StorageId)> {
        let mut bounds = std::mem::take(&mut self.bounds);
        bounds.clear();
        bounds
    }

    /// Gives back the list [`CandidateSearch::take_bounds`] lent.
    pub(crate) fn give_back_bounds(&mut self, bounds: Vec<(f64, StorageId)>) {
        self.bounds = bounds;
    }

    /// A search scoring as `sampling` says, its draws seeded by `seed`.
    pub fn new(sampling: Sampling, seed: u64) -> CandidateSearch {
        CandidateSearch {
            sampling,
            rng: SearchRng::seed_from_u64(seed),
            buckets: Vec::new(),
            ordered_share: 0.0,
            searches: 0,
            entry_share: 0.0,
            deferred: DeferredDraws::default(),
            bounds: Vec::new(),
        }
    }

    /// The candidate with the lowest score, and that score: the last one on
    /// ties, and a score of 0 ends the search (nothing can be lower).
    /// `score` gets the lowest score so far and may answer `None` for a
    /// candidate whose score it knows to be above it (it could not be
    /// chosen); the candidates drawn, and so the choice, are the same
    /// either way.
    ///
    /// `density_floor` is `Some(clock)` when every score is at least the
    /// candidate's key over its staleness at `clock`, `(c0 + extra) /
    /// (held · stale)` (see [`Bounds`](super::Bounds); with no extra set,
    /// [`Candidate::cost_density_bound`]): a √N draw whose
    /// [`Summary`](super::Summary) bound is already above the best score
    /// is then passed over without reading its entry or scoring it, as
    /// `score` would have answered `None` for it.
    ///
    /// With √N sampling, ⌈√N⌉ candidates are drawn uniformly with
    /// replacement, skipping those under 1% of the average size (the first
    /// of those is scored only when nothing else was drawn), at most 4·⌈√N⌉
    /// members in all, and scored in the order drawn; each draw is the
    /// block of `run_length` neighbouring positions from a uniform multiple
    /// of that length. Blocks' summaries are prefetched `WINDOW` draws
    /// ahead; the generator is left as if drawn one at a time, up to the
    /// draw that ended the search.
    pub fn lowest(
        &mut self,
        pool: &CandidatePool,
        density_floor: Option<u64>,
        mut score: impl FnMut(&Candidate, Option<f64>) -> Option<f64>,
    ) -> Option<(StorageId, f64)> {
        let mut best: Option<(f64, StorageId)> = None;
        // Scores `candidate`, keeping the best; whether the search ends.
        let mut consider = |best: &mut Option<(f64, StorageId)>, candidate: &Candidate| {
            let Some(s) = score(candidate, best.map(|(b, _)| b)) else {
                return false;
            };
            if best.is_none_or(|(b, _)| s <= b) {
                *best = Some((s, candidate.storage));
            }
            s <= 0.0
        };
        match self.sampling {
            Sampling::All => {
                for candidate in pool.iter() {
                    if consider(&mut best, candidate) {
                        break;
                    }
                }
            }
            Sampling::Sqrt => return self.lowest_sampled(pool, density_floor, score),
        }
        best.map(|(score, storage)| (storage, score))
    }

    /// [`CandidateSearch::lowest`] with √N sampling, in two passes that
    /// choose as one pass in the order drawn would. The first draws the
    /// sample, judging each drawn block's summaries a line at a time, and
    /// scores at once the draws that could score 0 (their key is 0, or
    /// there is no bound), which end the search where they are drawn. The
    /// second scores the draw of the lowest bound, then in the order drawn
    /// each draw whose bound is not above the best score so far, the later
    /// draw winning a tie: a pass in the order drawn reads every draw that
    /// lowers the best score (about ln √N of them), this one mostly the
    /// lowest alone.
    fn lowest_sampled(
        &mut self,
        pool: &CandidatePool,
        density_floor: Option<u64>,
        mut score: impl FnMut(&Candidate, Option<f64>) -> Option<f64>,
    ) -> Option<(StorageId, f64)> {
        let n = pool.len();
        if n == 0 {
            return None;
        }
        let wanted = (n as f64).sqrt().ceil() as usize;
        let threshold = pool.bytes() / n as u64 / 100;
        let packed_threshold = HeldThreshold::new(threshold);
        let (entries, summaries) = (pool.entries(), pool.summaries());
        assert_eq!(
            summaries.len(),
            entries.len(),
            "√N draws read kept summaries"
        );
        let entry = |slot: usize| entries[slot].as_ref().expect("a member's entry");
        let clock = BoundClock::new(density_floor.unwrap_or(0));
        // Where most draws get past their summary (candidates alike but
        // for their neighbours, as in a uniform chain), their entries are
        // read anyway: fetch them with the summaries rather than one miss
        // after another.
        let with_entries = self.entry_share > 0.5;
        let len = entries.len();
        let run = run_length(wanted);
        let blocks = len.div_ceil(run);
        // Draws of one position (pools up to about 16,000 candidates, which
        // the cache holds) are scored as they are drawn unless their bound
        // rules them out; larger draws are deferred to the second pass,
        // which reads fewer entries, each likely a cache miss.
        let two_pass = run > 1;
        // A block's summaries share one line; positions past the pool's
        // end are holes there.
        let fetch = |start: usize| {
            summaries.prefetch(start);
            if with_entries {
                prefetch_range(entries, start..(start + run).min(len));
            }
        };
        // The lowest score so far, with the index of its draw among those
        // sampled (from 1) and its storage.
        let mut best: Option<(f64, u32, StorageId)> = None;
        let mut read = 0;
        // Scores the `at`th sampled draw; whether it scored 0 or less.
        let mut consider = |best: &mut Option<(f64, u32, StorageId)>, candidate: &Candidate, at| {
            read += 1;
            let Some(s) = score(candidate, best.map(|(b, ..)| b)) else {
                return false;
            };
            if best.is_none_or(|(b, was, _)| s < b || (s == b && at > was)) {
                *best = Some((s, at, candidate.storage));
            }
            s <= 0.0
        };
        let mut deferred = std::mem::take(&mut self.deferred);
        deferred.clear();
        let mut fallback = None;
        let (mut members, mut sampled) = (0, 0u32);
        // Draw i waits in `ring[i % WINDOW]`, its summaries prefetched,
        // until it is visited, while draw i + WINDOW takes its place:
        // WINDOW draws stay in flight. `checkpoints[k % 2]` is the generator
        // before draw k·WINDOW, to rewind it exactly.
        let mut checkpoints = [self.rng.clone(), self.rng.clone()];
        let mut ring = [0usize; WINDOW];
        for start in &mut ring {
            *start = self.rng.gen_range(0..blocks) * run;
            fetch(*start);
        }
        let mut drawn = 0;
        loop {
            let at = drawn % WINDOW;
            let start = ring[at];
            if at == 0 {
                checkpoints[(drawn / WINDOW + 1) % 2] = self.rng.clone();
            }
            ring[at] = self.rng.gen_range(0..blocks) * run;
            fetch(ring[at]);
            drawn += 1;
            if two_pass {
                let (line, first_lane) = (start / PER_LINE, start % PER_LINE);
                let verdict = summaries.judge(line, packed_threshold);
                let block = (((1u16 << run) - 1) << first_lane) as u8;
                let block_members = verdict.members & block;
                let small = verdict.small & block_members;
                let sampled_lanes = block_members & !small;
                let (member_count, sampled_count) =
                    (block_members.count_ones(), sampled_lanes.count_ones());
                // The whole block at once, where nothing in it needs its
                // entry to tell its size, is scored now or ends the sample.
                let whole = verdict.unsure & block_members == 0
                    && (density_floor.is_some() && verdict.zero_key & sampled_lanes == 0)
                    && members + (member_count as usize) < 4 * wanted
                    && ((sampled + sampled_count) as usize) < wanted;
                if whole {
                    members += member_count as usize;
                    if small != 0 && fallback.is_none() {
                        let lane = small.trailing_zeros() as usize;
                        fallback = Some(*entry(line * PER_LINE + lane));
                    }
                    let bounds = summaries.bounds(line, clock);
                    if run == PER_LINE {
                        deferred.push_line(bounds, sampled_lanes, line, sampled);
                    } else {
                        let mut lanes = sampled_lanes;
                        for index in (sampled + 1..).take(sampled_count as usize) {
                            let lane = lanes.trailing_zeros() as usize;
                            lanes &= lanes - 1;
                            deferred.push(bounds[lane], line * PER_LINE + lane, index);
                        }
                    }
                    sampled += sampled_count;
                    continue;
                }
            }
            // Position by position, as one pass in the order drawn.
            let mut done = false;
            for slot in start..start + run {
                let summary = summaries.get(slot);
                if summary.is_hole() {
                    continue;
                }
                members += 1;
                let small = summary
                    .held_below(packed_threshold)
                    .unwrap_or_else(|| entry(slot).held < threshold);
                if small {
                    fallback.get_or_insert(*entry(slot));
                } else {
                    sampled += 1;
                    if density_floor.is_none() || summary.key_is_zero() {
                        done = consider(&mut best, entry(slot), sampled);
                    } else {
                        let bound = summary.cost_density_bound(clock);
                        if two_pass {
                            deferred.push(bound, slot, sampled);
                        } else if best.is_none_or(|(b, ..)| bound <= b) {
                            // Above 0: it cannot end the search.
                            consider(&mut best, entry(slot), sampled);
                        }
                    }
                }
                if done || sampled as usize == wanted || members == 4 * wanted {
                    done = true;
                    break;
                }
            }
            if done {
                break;
            }
        }
        let zero = best.is_some_and(|(b, ..)| b <= 0.0);
        deferred.pad();
        if let (false, Some(first)) = (zero, deferred.lowest()) {
            let (position, at) = deferred.draws[first];
            consider(&mut best, entry(position as usize), at);
            let limit =
                |best: Option<(f64, u32, StorageId)>| best.map_or(f64::INFINITY, |(b, ..)| b);
            for (chunk_index, chunk) in deferred.chunks().iter().enumerate() {
                let mut lanes = at_most(chunk, limit(best));
                while lanes != 0 {
                    let lane = lanes.trailing_zeros() as usize;
                    lanes &= lanes - 1;
                    let (position, index) = deferred.draws[chunk_index * PER_LINE + lane];
                    if index != at && chunk[lane] <= limit(best) {
                        consider(&mut best, entry(position as usize), index);
                    }
                }
            }
        }
        if sampled == 0 {
            if let Some(candidate) = fallback {
                consider(&mut best, &candidate, 0);
            }
        }
        self.deferred = deferred;
        self.entry_share = 0.9 * self.entry_share + 0.1 * read as f64 / members.max(1) as f64;
        // Undo the draws after the `drawn`th.
        self.rng = checkpoints[(drawn / WINDOW) % 2].clone();
        for _ in 0..drawn % WINDOW {
            self.rng.gen_range(0..blocks);
        }
        best.map(|(score, _, storage)| (storage, score))
    }
}

/// A bound from a [`PoolOrder`] key is compared only after lowering it by
/// this relative margin: the key, the staleness and the score are rounded
/// differently (a few units of 2⁻⁵³ each), and the margin keeps the bound
/// below every score it bounds, so pruning never drops a possible victim.
const MARGIN: f64 = 1.0 - 1.0 / (1u64 << 30) as f64;

/// The best candidate found by [`CandidateSearch::lowest_ordered`], chosen
/// as the full scan in pool order would choose it.
#[derive(Clone, Copy)]
struct Best {
    score: f64,
    position: u32,
    storage: StorageId,
}

impl Best {
    /// Whether the full scan would choose `score` at `position` over `self`.
    fn beaten_by(&self, score: f64, position: u32) -> bool {
        chosen_before((score, position), (self.score, self.position))
    }
}

/// Whether the full scan in pool order would choose the candidate of score
/// `a.0` at position `a.1` over that of `b`: the scan ends at the first
/// score ≤ 0, and otherwise keeps the last of the lowest.
pub fn chosen_before(a: (f64, u32), b: (f64, u32)) -> bool {
    let ((score, position), (other, other_position)) = (a, b);
    if score <= 0.0 || other <= 0.0 {
        other > 0.0 || (score <= 0.0 && position < other_position)
    } else {
        score < other || (score == other && position > other_position)
    }
}

impl CandidateSearch {
    /// What [`CandidateSearch::lowest`] with [`Sampling::All`] would find
    /// (the same candidate and score, bit for bit), visiting the candidates
    /// in the pool's [`PoolOrder`], which must be a lower bound of `score`:
    /// a candidate is scored only while its bound could still beat or tie
    /// the best score so far, so most are never read. Ties go as in the
    /// scan: the last in pool order, or the first scoring 0. Without an
    /// order kept in the pool (or with √N sampling), it is
    /// [`CandidateSearch::lowest`].
    ///
    /// `score` gets the score a candidate must beat or tie and may answer
    /// `None` for one whose score it knows to be above it. `clock` is the
    /// clock staleness is measured against.
    pub fn lowest_ordered(
        &mut self,
        pool: &CandidatePool,
        clock: u64,
        mut score: impl FnMut(&Candidate, Option<f64>) -> Option<f64>,
    ) -> Option<(StorageId, f64)> {
        let order = match (self.sampling, pool.order()) {
            (Sampling::All, Some(order)) => order,
            _ => return self.lowest(pool, None, score),
        };
        // The bound of a place. In the orders that `ends_bucket`, the places
        // after it in its bucket (accessed later) have bounds at least as
        // high, so the first bound too high ends the bucket.
        let bound = |&(bucket, last_access, _): &Place| -> f64 {
            let bound = match order {
                PoolOrder::CostDensity => {
                    let stale = clock.saturating_sub(last_access);
                    if stale == 0 {
                        f64::INFINITY
                    } else {
                        bucket_floor(bucket) / stale as f64
                    }
                }
                PoolOrder::CostPerByte | PoolOrder::InverseSize => bucket_floor(bucket),
                PoolOrder::LastAccess => last_access as f64,
            };
            bound * MARGIN
        };
        let ends_bucket = matches!(order, PoolOrder::CostDensity | PoolOrder::LastAccess);
        // Each non-empty bucket, by the bound of its first place (the
        // lowest in it), lowest first.
        let buckets = &mut self.buckets;
        buckets.clear();
        let mut from = (0, 0, 0);
        while let Some(first) = pool.places_from(from).next() {
            buckets.push((bound(first), *first));
            match first.0.checked_add(1) {
                Some(next) => from = (next, 0, 0),
                None => break,
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut best: Option<Best> = None;
        let mut visited = 0usize;
        // Scores above this cannot be chosen: the best so far, or 0 once a
        // score ≤ 0 is found (an earlier 0 would still win).
        let limit = |best: &Option<Best>| best.map(|b| b.score.max(0.0));
        for &(first_bound, first) in buckets.iter() {
            if limit(&best).is_some_and(|limit| first_bound > limit) {
                break;
            }
            for place in pool
                .places_from(first)
                .take_while(|place| place.0 == first.0)
            {
                visited += 1;
                let limit = limit(&best);
                if limit.is_some_and(|limit| bound(place) > limit) {
                    if ends_bucket {
                        break;
                    }
                    continue;
                }
                // The bucket's floor is up to 2^(1/4) below the key: where
                // many scores are that close to the best, the exact key
                // spares scoring most of them.
                let exact = order == PoolOrder::CostDensity;
                if exact && limit.is_some_and(|limit| pool.key_bound(place.2, clock) > limit) {
                    continue;
                }
                let candidate = pool.at(place.2);
                let Some(s) = score(candidate, limit) else {
                    continue;
                };
                if best.is_none_or(|b| b.beaten_by(s, place.2)) {
                    best = Some(Best {
                        score: s,
                        position: place.2,
                        storage: candidate.storage,
                    });
                }
            }
        }
        // How much of the pool it took, for `lowest_exact`'s choice.
        let share = visited as f64 / pool.len().max(1) as f64;
        self.ordered_share += (share - self.ordered_share) / 8.0;
        best.map(|b| (b.storage, b.score))
    }

    /// [`CandidateSearch::lowest_ordered`] while it visits a small share of
    /// the candidates, [`CandidateSearch::lowest`] while it would visit
    /// most of them (a plain scan reads them faster, in pool order), trying
    /// the order again every `RETRY` searches: both choose the same, so
    /// which runs changes only the time taken.
    pub fn lowest_exact(
        &mut self,
        pool: &CandidatePool,
        clock: u64,
        score: impl FnMut(&Candidate, Option<f64>) -> Option<f64>,
    ) -> Option<(StorageId, f64)> {
        let ordered = self.next_search_is_ordered();
        self.searches = self.searches.wrapping_add(1);
        if ordered {
            self.lowest_ordered(pool, clock, score)
        } else {
            self.lowest(pool, None, score)
        }
    }

    /// Whether the next [`CandidateSearch::lowest_exact`] searches in the
    /// pool's order (else it scans every candidate).
    pub fn next_search_is_ordered(&self) -> bool {
        self.ordered_share < ORDERED_UP_TO || self.searches.wrapping_add(1) % RETRY == 0
    }
}

/// The share of the candidates up to which (averaged over the last few
/// searches) the ordered search runs rather than the plain scan: visiting
/// a candidate in order costs a few times a step of the scan.
const ORDERED_UP_TO: f64 = 0.25;

/// The plain scan tries the ordered search again every this many searches.
const RETRY: u64 = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pool::tests::info;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use slotmap::{SecondaryMap, SlotMap};

    /// The √N search as the DTR prototype does it, one draw at a time (a
    /// draw being the aligned block of [`run_length`] positions in large
    /// pools).
    fn one_at_a_time(
        rng: &mut SearchRng,
        pool: &CandidatePool,
        score: impl Fn(&Candidate) -> f64,
    ) -> Option<(StorageId, f64)> {
        let n = pool.len();
        if n == 0 {
            return None;
        }
        let wanted = (n as f64).sqrt().ceil() as usize;
        let threshold = pool.bytes() / n as u64 / 100;
        let entries = pool.entries();
        let len = entries.len();
        let run = run_length(wanted);
        let (mut best, mut fallback) = (None::<(f64, StorageId)>, None);
        let (mut members, mut sampled) = (0, 0);
        'draws: loop {
            let start = rng.gen_range(0..len.div_ceil(run)) * run;
            for offset in 0..run {
                let Some(Some(candidate)) = entries.get(start + offset) else {
                    continue;
                };
                members += 1;
                if candidate.held < threshold {
                    fallback.get_or_insert(candidate);
                } else {
                    sampled += 1;
                    let s = score(candidate);
                    if best.is_none_or(|(b, _)| s <= b) {
                        best = Some((s, candidate.storage));
                    }
                    if s <= 0.0 {
                        break 'draws;
                    }
                }
                if sampled == wanted || members == 4 * wanted {
                    break 'draws;
                }
            }
        }
        if let (0, Some(candidate)) = (sampled, fallback) {
            best = Some((score(candidate), candidate.storage));
        }
        best.map(|(s, storage)| (storage, s))
    }

    #[test]
    fn runs_are_one_position_in_small_pools_and_a_power_of_two_in_large_ones() {
        assert_eq!(run_length(1), 1);
        assert_eq!(run_length(127), 1);
        assert_eq!(run_length(128), 2);
        assert_eq!(run_length(255), 2);
        assert_eq!(run_length(256), 4);
        assert_eq!(run_length(511), 4);
        assert_eq!(run_length(1000), 8);
        assert_eq!(run_length(1_000_000), 8);
    }

    /// Draws taken ahead, skipped candidates and draws passed over by their
    /// summary's bound (keys' extras counted) change nothing: the same
    /// victims, scores and generator state as one draw at a time, with
    /// holes in the pool, small candidates, ties and zero scores; in pools
    /// large enough for blocks of 2 and 4 positions too, the last block
    /// running past the pool's end.
    #[test]
    fn sqrt_search_chooses_as_one_draw_at_a_time() {
        let mut setup = StdRng::seed_from_u64(7);
        let clock = 20;
        for n in [1usize, 2, 3, 10, 57, 400, 3000, 25_001, 100_003, 300_005] {
            let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
            let mut scores = SecondaryMap::new();
            let mut pool = CandidatePool::new();
            for _ in 0..n {
                let id = keys.insert(());
                // One in eight under 1% of the average; scores tie often.
                let held = if setup.gen_ratio(1, 8) { 1 } else { 1000 };
                let (cost, last_access) = (setup.gen_range(0..4), setup.gen_range(0..=clock));
                pool.insert(id, held, &info(held, cost, last_access));
                scores.insert(id, setup.gen_range(0..3 * n as u64) as f64);
            }
            let ids: Vec<StorageId> = keys.keys().collect();
            for &id in &ids {
                if setup.gen_ratio(1, 3) {
                    pool.remove(id);
                }
            }
            if ids.iter().all(|&id| !pool.contains(id)) {
                pool.insert(ids[0], 1000, &info(1000, 1, 1));
            }
            // Keys' extras, which the summaries' bounds count.
            for &id in &ids {
                if setup.gen_ratio(1, 4) {
                    let held = pool.get(id).map_or(0, |c| c.held);
                    pool.bounds().set(id, setup.gen_range(0..8), held);
                }
            }
            assert_eq!(pool.check_summaries(), Ok(()));
            assert!(n < 57 || ids.iter().any(|&id| pool.extra(id) > 0));
            for seed in 0..20 {
                // Odd seeds score at least the key over the staleness
                // (scaled up so the bound prunes), and say so.
                let floor = (seed % 2 == 1).then_some(clock);
                let score = |c: &Candidate| {
                    let keyed = Candidate {
                        cost: c.cost + pool.extra(c.storage),
                        ..*c
                    };
                    let density = keyed.cost_density_bound(clock);
                    match floor {
                        Some(_) if density.is_finite() => scores[c.storage] + 50.0 * density,
                        Some(_) => f64::INFINITY,
                        None => scores[c.storage],
                    }
                };
                let mut search = CandidateSearch::new(Sampling::Sqrt, seed);
                let mut reference = SearchRng::seed_from_u64(seed);
                for _ in 0..5 {
                    let expected = one_at_a_time(&mut reference, &pool, score);
                    let found = search.lowest(&pool, floor, |c, best| {
                        let score = score(c);
                        // A true bound: half the score.
                        (!best.is_some_and(|best| score / 2.0 > best)).then_some(score)
                    });
                    assert_eq!(found, expected, "n = {n}, seed {seed}");
                }
                assert_eq!(search.rng.gen::<u64>(), reference.gen::<u64>());
            }
        }
    }
}

#[cfg(test)]
mod ordered_tests {
    use super::*;
    use crate::policy::pool::tests::info;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use slotmap::{SecondaryMap, SlotMap};

    /// What a storage of a random pool is, beside its pool entry.
    #[derive(Clone, Copy)]
    struct Truth {
        bytes: u64,
        held: u64,
        cost: u64,
        extra: u64,
        last_access: u64,
    }

    /// Scores as the heuristic of each order does, from its graph record:
    /// never below the order's bound.
    fn score(order: PoolOrder, t: &Truth, clock: u64) -> f64 {
        let per = |numerator: f64, denominator: f64| {
            if denominator > 0.0 {
                numerator / denominator
            } else {
                f64::INFINITY
            }
        };
        let total = (t.cost + t.extra) as f64;
        match order {
            PoolOrder::CostDensity => per(
                total,
                t.bytes as f64 * clock.saturating_sub(t.last_access) as f64,
            ),
            PoolOrder::CostPerByte => per(total, t.bytes as f64),
            PoolOrder::LastAccess => t.last_access as f64,
            PoolOrder::InverseSize => per(1.0, t.bytes as f64),
        }
    }

    fn draw(rng: &mut StdRng, clock: u64, spread: u64) -> Truth {
        let bytes = match rng.gen_range(0..10) {
            0 => 0,
            1..=4 => 1 << rng.gen_range(0..4),
            _ => rng.gen_range(1..spread.max(2)),
        };
        let held = if rng.gen_ratio(1, 3) {
            bytes + rng.gen_range(0..256)
        } else {
            bytes
        };
        Truth {
            bytes,
            held,
            cost: match rng.gen_range(0..6) {
                0 => 0,
                1 | 2 => rng.gen_range(1..4),
                _ => rng.gen_range(0..spread.max(1) * 100),
            },
            extra: if rng.gen_ratio(1, 2) {
                0
            } else {
                rng.gen_range(0..spread.max(1) * 50)
            },
            last_access: clock.saturating_sub(match rng.gen_range(0..8) {
                0 => 0,
                1..=3 => rng.gen_range(0..4),
                _ => rng.gen_range(0..spread.max(1) * 10),
            }),
        }
    }

    /// The ordered search chooses exactly what the full scan in pool order
    /// chooses (candidate and score, bit for bit), over random pools kept
    /// in order through inserts, updates, removals, compactions and extras
    /// in the keys (lower bounds of what the scores add): sizes,
    /// costs and staleness from few values (ties) to many, zero costs,
    /// zero sizes, candidates accessed now.
    #[test]
    fn ordered_search_chooses_as_the_full_scan() {
        let orders = [
            PoolOrder::CostDensity,
            PoolOrder::CostPerByte,
            PoolOrder::LastAccess,
            PoolOrder::InverseSize,
        ];
        let mut rng = StdRng::seed_from_u64(17);
        let (mut visited, mut candidates) = (0usize, 0usize);
        for round in 0..400 {
            let order = orders[round % orders.len()];
            let spread = [2u64, 5, 40, 1000, 1 << 40][rng.gen_range(0..5)];
            let n = [1usize, 3, 20, 150, 2000][rng.gen_range(0..5)];
            let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
            let mut truth: SecondaryMap<StorageId, Truth> = SecondaryMap::new();
            let mut pool = CandidatePool::new();
            let mut clock = rng.gen_range(1..spread.max(2) * 20);
            // Half the pools keep their order from the start, half from the
            // middle; some only while they hold `from` candidates or more
            // (half as many once built), building and dropping it as they
            // grow and shrink.
            let early = rng.gen_ratio(1, 2);
            let from = [0, 0, n / 4, n / 2][rng.gen_range(0..4)];
            if early {
                pool.keep_order(Some(order), from);
            }
            let ids: Vec<StorageId> = (0..n).map(|_| keys.insert(())).collect();
            for step in 0..3 * n {
                if step == n && !early {
                    pool.keep_order(Some(order), from);
                }
                let id = ids[rng.gen_range(0..n)];
                match rng.gen_range(0..6) {
                    0 if pool.contains(id) => pool.remove(id),
                    1 if pool.contains(id) => {
                        // The graph's cost or last access changes.
                        let t = truth.get_mut(id).unwrap();
                        clock += rng.gen_range(0..3);
                        t.last_access = clock;
                        if rng.gen_ratio(1, 2) {
                            t.cost = rng.gen_range(0..spread * 10);
                        }
                        let t = *t;
                        pool.refresh(id, &info(t.bytes, t.cost, t.last_access));
                    }
                    // A heuristic keys it by part of what it adds to `c0`.
                    2 if pool.contains(id) => {
                        let t = truth[id];
                        pool.bounds().set(id, rng.gen_range(0..=t.extra), t.bytes);
                    }
                    3 if rng.gen_ratio(1, 50) => pool.bounds().clear(),
                    _ => {
                        let t = draw(&mut rng, clock, spread);
                        truth.insert(id, t);
                        pool.insert(id, t.held, &info(t.bytes, t.cost, t.last_access));
                    }
                }
            }
            clock += rng.gen_range(0..3);
            let mut search = CandidateSearch::new(Sampling::All, 0);
            let expected = search.lowest(&pool, None, |c, _| {
                Some(score(order, &truth[c.storage], clock))
            });
            let mut scored = 0;
            let found = search.lowest_ordered(&pool, clock, |c, _| {
                scored += 1;
                Some(score(order, &truth[c.storage], clock))
            });
            let same = match (found, expected) {
                (Some((a, x)), Some((b, y))) => a == b && x.to_bits() == y.to_bits(),
                (None, None) => true,
                _ => false,
            };
            assert!(same, "round {round}, {order:?}: {found:?} != {expected:?}");
            // A search that prunes by the bound itself chooses the same.
            let pruned = search.lowest_ordered(&pool, clock, |c, best| {
                let s = score(order, &truth[c.storage], clock);
                let bound = c.cost_density_bound(clock);
                let prune = order == PoolOrder::CostDensity && best.is_some_and(|b| bound > b);
                (!prune).then_some(s)
            });
            assert_eq!(pruned.map(|p| p.0), expected.map(|e| e.0), "round {round}");
            visited += scored;
            candidates += pool.len();
        }
        // The point of the order: most candidates are never scored.
        assert!(visited < candidates, "{visited} of {candidates}");
    }
}
