//! Static placement: given every allocation's lifetime, an offset for each
//! so that allocations alive at the same time never overlap, in as small an
//! arena as a greedy packer finds. A run's allocations, placed this way,
//! cannot fragment (MegEngine's "pushdown" static allocation does the same
//! for a static graph).

use serde::{Deserialize, Serialize};

/// When one allocation was alive, in reservation steps: made at `start`,
/// freed before `end` (half-open), `bytes` long (aligned as placed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lifetime {
    /// Its size in bytes.
    pub bytes: u64,
    /// The reservation step that made it.
    pub start: u64,
    /// The reservation step before which it was freed.
    pub end: u64,
}

impl Lifetime {
    fn overlaps_in_time(&self, other: &Lifetime) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Offsets for `lifetimes` (in their order) and the arena size they need.
/// Greedy first fit: in some order, each goes at the lowest offset, a
/// multiple of `alignment`, clear of every placed allocation alive at the
/// same time. Four orders are tried (largest first, then among equal sizes
/// earliest first or longest-lived first; largest area of bytes × lifetime
/// first; longest-lived first; earliest first among other equals), and a
/// fifth packer that lets the lowest placement choose the next allocation
/// (`pack_lowest_first`); the smallest arena is kept: none wins on every
/// program.
pub fn pack(lifetimes: &[Lifetime], alignment: u64) -> (Vec<u64>, u64) {
    use std::cmp::Reverse;
    // Size or area, then lifetime, both descending; then start.
    type Key = (Reverse<u64>, Reverse<u64>, u64);
    let orders: [fn(&Lifetime) -> Key; 4] = [
        |l| (Reverse(l.bytes), Reverse(0), l.start),
        |l| (Reverse(l.bytes), Reverse(l.end - l.start), l.start),
        |l| {
            (
                Reverse(l.bytes.saturating_mul(l.end - l.start)),
                Reverse(0),
                l.start,
            )
        },
        |l| (Reverse(l.end - l.start), Reverse(0), l.start),
    ];
    let mut best: Option<(Vec<u64>, u64)> = None;
    for key in orders {
        let mut order: Vec<usize> = (0..lifetimes.len()).collect();
        order.sort_by_key(|&i| (key(&lifetimes[i]), i));
        let packed = pack_in_order(lifetimes, &order, alignment);
        if best.as_ref().is_none_or(|(_, arena)| packed.1 < *arena) {
            best = Some(packed);
        }
    }
    let packed = pack_lowest_first(lifetimes, alignment);
    if best.as_ref().is_none_or(|(_, arena)| packed.1 < *arena) {
        best = Some(packed);
    }
    best.unwrap_or_default()
}

/// The most bytes' end address over a range of steps, raised range by range
/// (a segment tree with lazy "at least" tags).
struct Skyline {
    size: usize,
    top: Vec<u64>,
    tag: Vec<u64>,
}

impl Skyline {
    fn new(steps: usize) -> Skyline {
        let size = steps.next_power_of_two().max(1);
        Skyline {
            size,
            top: vec![0; 2 * size],
            tag: vec![0; 2 * size],
        }
    }

    /// The highest top over steps `[from, to)`.
    fn highest(&self, from: usize, to: usize) -> u64 {
        self.query(1, 0, self.size, from, to, 0)
    }

    fn query(&self, node: usize, lo: usize, hi: usize, from: usize, to: usize, above: u64) -> u64 {
        if to <= lo || hi <= from {
            return 0;
        }
        if from <= lo && hi <= to {
            return self.top[node].max(above);
        }
        let above = above.max(self.tag[node]);
        let mid = (lo + hi) / 2;
        self.query(2 * node, lo, mid, from, to, above)
            .max(self.query(2 * node + 1, mid, hi, from, to, above))
    }

    /// Raises the top over steps `[from, to)` to at least `value`.
    fn raise(&mut self, from: usize, to: usize, value: u64) {
        self.update(1, 0, self.size, from, to, value);
    }

    fn update(&mut self, node: usize, lo: usize, hi: usize, from: usize, to: usize, value: u64) {
        if to <= lo || hi <= from {
            return;
        }
        if from <= lo && hi <= to {
            self.top[node] = self.top[node].max(value);
            self.tag[node] = self.tag[node].max(value);
            return;
        }
        let mid = (lo + hi) / 2;
        self.update(2 * node, lo, mid, from, to, value);
        self.update(2 * node + 1, mid, hi, from, to, value);
        self.top[node] = self.top[node]
            .max(self.top[2 * node])
            .max(self.top[2 * node + 1]);
    }
}

/// Lowest offset first: repeatedly places, of the allocations not placed
/// yet, one that can go lowest (to within a 4096th of the most bytes alive
/// at once; ties: the longest-lived, then the largest), at the lowest
/// offset on the skyline: the highest end, over the steps of its life, of
/// the allocations placed so far. There it is clear of all of them; holes
/// under the skyline are not reused, in exchange for two O(log steps) tree
/// walks per try. An allocation's lowest offset only rises as others are
/// placed, so it waits in a heap with it as a bound and is found again
/// only when it comes to the top. On the DTR authors' InceptionV4 at 0.3
/// it packs 6% tighter than the best first-fit order.
fn pack_lowest_first(lifetimes: &[Lifetime], alignment: u64) -> (Vec<u64>, u64) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let align = |offset: u64| offset.div_ceil(alignment.max(1)) * alignment.max(1);
    let steps = lifetimes.iter().map(|l| l.end).max().unwrap_or(0) as usize;
    let mut sky = Skyline::new(steps);
    let mut offsets = vec![0u64; lifetimes.len()];
    // Most bytes alive at once, by a difference array over the steps.
    let mut delta = vec![0i128; steps + 1];
    for l in lifetimes.iter().filter(|l| l.start < l.end) {
        delta[l.start as usize] += i128::from(l.bytes);
        delta[l.end as usize] -= i128::from(l.bytes);
    }
    let most_alive = delta
        .iter()
        .scan(0i128, |alive, d| {
            *alive += d;
            Some(*alive)
        })
        .max()
        .unwrap_or(0) as u64;
    // Bounds are kept in steps of 1/4096 of that: far fewer turns in the
    // heap (a fifth to a tenth on the authors' logs), arenas within 2%
    // either way.
    let step = align((most_alive / 4096).max(1));
    let level = |offset: u64| offset.div_ceil(step) * step;
    let key = |offset: u64, i: usize| {
        let l = &lifetimes[i];
        Reverse((
            level(offset),
            Reverse(l.end - l.start),
            Reverse(l.bytes),
            l.start,
            i,
        ))
    };
    let mut heap: BinaryHeap<_> = (0..lifetimes.len())
        .filter(|&i| lifetimes[i].bytes > 0 && lifetimes[i].start < lifetimes[i].end)
        .map(|i| key(0, i))
        .collect();
    let mut arena = 0;
    while let Some(Reverse((bound, _, _, _, i))) = heap.pop() {
        let l = &lifetimes[i];
        let (from, to) = (l.start as usize, l.end as usize);
        let lowest = align(sky.highest(from, to));
        // Risen to a higher level, it waits its turn again, unless it
        // would come first anyway.
        if level(lowest) > bound && heap.peek().is_some_and(|next| *next > key(lowest, i)) {
            heap.push(key(lowest, i));
            continue;
        }
        offsets[i] = lowest;
        sky.raise(from, to, lowest + l.bytes);
        arena = arena.max(lowest + l.bytes);
    }
    (offsets, arena)
}

/// First fit in the given order.
fn pack_in_order(lifetimes: &[Lifetime], order: &[usize], alignment: u64) -> (Vec<u64>, u64) {
    let align = |offset: u64| offset.div_ceil(alignment.max(1)) * alignment.max(1);
    let mut offsets = vec![0u64; lifetimes.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(lifetimes.len());
    let mut arena = 0u64;
    let mut busy: Vec<(u64, u64)> = Vec::new();
    for &i in order {
        let me = &lifetimes[i];
        if me.bytes == 0 {
            continue;
        }
        // The address ranges taken while `me` lives, in address order.
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|&&j| lifetimes[j].overlaps_in_time(me))
                .map(|&j| (offsets[j], offsets[j] + lifetimes[j].bytes)),
        );
        busy.sort_unstable();
        let mut offset = 0;
        for &(from, to) in &busy {
            if offset + me.bytes <= from {
                break;
            }
            offset = offset.max(align(to));
        }
        offsets[i] = offset;
        arena = arena.max(offset + me.bytes);
        placed.push(i);
    }
    (offsets, arena)
}

/// Whether the placement is sound: no two allocations alive at once
/// overlap in address, and all lie within `arena` bytes.
pub fn check(lifetimes: &[Lifetime], offsets: &[u64], arena: u64) -> Result<(), String> {
    if offsets.len() != lifetimes.len() {
        return Err(format!(
            "{} offsets for {} allocations",
            offsets.len(),
            lifetimes.len()
        ));
    }
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, l) in lifetimes.iter().enumerate() {
        if l.bytes > 0 {
            if offsets[i].saturating_add(l.bytes) > arena {
                return Err(format!("allocation {i} ends past the arena of {arena} B"));
            }
            events.push((l.start, true, i));
            events.push((l.end, false, i));
        }
    }
    // Frees before allocations at the same step (intervals are half-open).
    events.sort_by_key(|&(time, alloc, i)| (time, alloc, i));
    let mut live: std::collections::BTreeMap<u64, (u64, usize)> = Default::default();
    for (_, alloc, i) in events {
        let (offset, bytes) = (offsets[i], lifetimes[i].bytes);
        if !alloc {
            live.remove(&offset);
            continue;
        }
        let before = live.range(..=offset).next_back();
        let after = live.range(offset..).next();
        for (&o, &(b, j)) in before.into_iter().chain(after) {
            if o < offset + bytes && offset < o + b {
                return Err(format!("allocations {j} and {i} overlap while both alive"));
            }
        }
        live.insert(offset, (bytes, i));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(bytes: u64, start: u64, end: u64) -> Lifetime {
        Lifetime { bytes, start, end }
    }

    #[test]
    fn allocations_alive_together_do_not_overlap_and_others_share() {
        // a and b live together; c comes after a is gone and reuses its place.
        let lifetimes = [life(256, 0, 3), life(512, 2, 9), life(256, 4, 9)];
        let (offsets, arena) = pack(&lifetimes, 256);
        check(&lifetimes, &offsets, arena).unwrap();
        assert_eq!(arena, 768, "the largest live set");
        assert_eq!(offsets, vec![512, 0, 512]);
    }

    #[test]
    fn lowest_first_packs_soundly_and_at_least_the_most_alive_at_once() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..200 {
            let n = rng.gen_range(1..60);
            let lifetimes: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let start = rng.gen_range(0..40);
                    life(
                        256 * rng.gen_range(1..9),
                        start,
                        start + rng.gen_range(1..20),
                    )
                })
                .collect();
            let (offsets, arena) = pack_lowest_first(&lifetimes, 256);
            check(&lifetimes, &offsets, arena).unwrap();
            let most_alive = (0..60)
                .map(|t| {
                    let alive = lifetimes.iter().filter(|l| l.start <= t && t < l.end);
                    alive.map(|l| l.bytes).sum::<u64>()
                })
                .max()
                .unwrap();
            assert!(arena >= most_alive);
            assert!(offsets.iter().all(|o| o % 256 == 0));
        }
    }

    #[test]
    fn the_checker_catches_overlaps_and_overruns() {
        let lifetimes = [life(100, 0, 5), life(100, 4, 6)];
        assert!(check(&lifetimes, &[0, 50], 200).is_err());
        assert!(check(&lifetimes, &[0, 100], 150).is_err());
        assert!(check(&lifetimes, &[0, 100], 200).is_ok());
        // Touching in time (one freed as the other is made) is fine.
        assert!(check(&[life(100, 0, 4), life(100, 4, 6)], &[0, 0], 100).is_ok());
    }
}
