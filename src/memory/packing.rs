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
/// first; longest-lived first; earliest first among other equals) and the
/// smallest arena kept: none wins on every program.
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
    best.unwrap_or_default()
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
    fn the_checker_catches_overlaps_and_overruns() {
        let lifetimes = [life(100, 0, 5), life(100, 4, 6)];
        assert!(check(&lifetimes, &[0, 50], 200).is_err());
        assert!(check(&lifetimes, &[0, 100], 150).is_err());
        assert!(check(&lifetimes, &[0, 100], 200).is_ok());
        // Touching in time (one freed as the other is made) is fine.
        assert!(check(&[life(100, 0, 4), life(100, 4, 6)], &[0, 0], 100).is_ok());
    }
}
