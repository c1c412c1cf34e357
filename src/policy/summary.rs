//! What a √N draw reads of a pool candidate: a [`Summary`] of 8 bytes,
//! eight to a cache line ([`Summaries`]).
//!
//! At 10⁶ candidates every draw is a cache miss, and the search's time is
//! the number of lines it touches. The entries take 32 bytes; a summary
//! keeps, rounded the safe way, only what decides whether the entry must
//! be read at all: whether the position holds a member, whether its bytes
//! are under the small-candidate threshold, and a lower bound of its cost
//! density over its staleness. The lines are aligned, so a draw of up to
//! eight neighbouring positions from a multiple of its length (see
//! [`crate::policy::CandidateSearch::lowest`]) reads exactly one line.

use super::pool::Candidate;

/// A pool entry's summary. Every field is rounded so that the bound it
/// gives is never above the entry's own: the density down, the last
/// access down (so the staleness up), the held bytes to a range that
/// contains them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// `(c0 + extra) / held`, lowered by a relative margin of 2⁻²⁰ and
    /// rounded down to a bfloat16 (an `f32`'s upper 16 bits); +∞ for no
    /// bytes; [`HOLE_DENSITY`] for a position with no member.
    density: u16,
    /// `held` exactly below 2¹⁵, else its leading 10 bits and their shift
    /// (see [`pack_held`]).
    held: u16,
    /// The last access rounded down to an `f32` (an integer, exactly).
    last_access: f32,
}

/// The density of a hole: a bfloat16 NaN, which no summarised density is
/// (a density is a quotient of non-negative integers with a non-zero
/// divisor, or +∞).
const HOLE_DENSITY: u16 = 0x7FC0;

/// The relative margin a summary's density is lowered by: far above the few
/// units of 2⁻⁵³ by which the entry's own bound and the summary's can be
/// rounded differently, far below any gap that matters to pruning.
const SUMMARY_MARGIN: f64 = 1.0 - 1.0 / (1u64 << 20) as f64;

/// The largest `f32` not above `x` (an integer, as every `f32` from 2²⁴ is
/// and every integer below it can be).
fn f32_at_most(x: u64) -> f32 {
    let rounded = x as f32;
    // `as` rounds to nearest; u128 holds 2⁶⁴, which u64::MAX rounds to.
    if rounded as u128 > u128::from(x) {
        rounded.next_down()
    } else {
        rounded
    }
}

/// Bytes from which `held` keeps only its leading bits.
const EXACT_HELD_BELOW: u64 = 1 << 15;

/// Leading bits of `held` kept from [`EXACT_HELD_BELOW`] on: the range it
/// is known to lie in spans 2⁻⁹ of its value.
const HELD_BITS: u32 = 10;

/// The top bit of packed held bytes: set where only their leading bits are
/// kept (from [`EXACT_HELD_BELOW`] on).
const ROUNDED_HELD: u16 = 0x8000;

/// `held` in 16 bits: itself below 2¹⁵; above, a set top bit, the shift
/// `s` (6 bits) and the 9 bits after the leading one of `held >> s`, so
/// `held` lies in `[(512 + m) · 2^s, (513 + m) · 2^s)`.
fn pack_held(held: u64) -> u16 {
    if held < EXACT_HELD_BELOW {
        return held as u16;
    }
    let shift = 64 - held.leading_zeros() - HELD_BITS;
    let mantissa = (held >> shift) & ((1 << (HELD_BITS - 1)) - 1);
    ROUNDED_HELD | (shift as u16) << (HELD_BITS - 1) | mantissa as u16
}

impl Summary {
    /// The summary of a position with no member.
    pub(super) const HOLE: Summary = Summary {
        density: HOLE_DENSITY,
        held: 0,
        last_access: 0.0,
    };

    /// The summary of `candidate`, whose key has the extra cost `extra`.
    pub(super) fn of(candidate: &Candidate, extra: u64) -> Summary {
        let density = if candidate.held == 0 {
            f32::INFINITY
        } else {
            let cost = candidate.cost.saturating_add(extra);
            let exact = cost as f64 / candidate.held as f64 * SUMMARY_MARGIN;
            let rounded = exact as f32;
            // `as` rounds to nearest; the bound must not be above.
            if f64::from(rounded) > exact {
                rounded.next_down()
            } else {
                rounded
            }
        };
        Summary {
            // Dropping the low bits of a non-negative `f32` rounds it down.
            density: (density.to_bits() >> 16) as u16,
            held: pack_held(candidate.held),
            last_access: f32_at_most(candidate.last_access),
        }
    }

    /// Whether the position holds no member.
    #[inline]
    pub fn is_hole(&self) -> bool {
        self.density == HOLE_DENSITY
    }

    /// Whether the member holds fewer than `threshold`'s bytes, if the
    /// summary alone tells (`None` from 2¹⁵ bytes on, when the threshold
    /// falls within 2⁻⁹ of them: read the entry). Packing is monotone, so
    /// one comparison of packed values tells.
    #[inline]
    pub fn held_below(&self, threshold: HeldThreshold) -> Option<bool> {
        match self.held.cmp(&threshold.0) {
            std::cmp::Ordering::Less => Some(true),
            std::cmp::Ordering::Greater => Some(false),
            // Equal and exact: as many bytes as the threshold.
            std::cmp::Ordering::Equal => (self.held & ROUNDED_HELD == 0).then_some(false),
        }
    }

    /// Whether the key `(c0 + extra) / held` is 0: only then can the
    /// member score 0 or less (its bound is 0 at any staleness).
    #[inline]
    pub fn key_is_zero(&self) -> bool {
        self.density == 0
    }

    /// A lower bound of the entry's key over its staleness at `clock`
    /// (`(c0 + extra) / (held · stale)`, at least
    /// [`Candidate::cost_density_bound`]), from the summary alone: the
    /// density is at least 2⁻²⁰ below `(c0 + extra) / held` in relative
    /// terms, the staleness is counted from an access no later than the
    /// last to a clock no earlier than `clock`, and the few roundings of
    /// 2⁻⁵³ between are far inside that margin.
    #[inline]
    pub fn cost_density_bound(&self, clock: BoundClock) -> f64 {
        bound(self.density, self.last_access, clock)
    }
}

/// [`Summary::cost_density_bound`] from a summary's density and last
/// access: +∞ unstale, NaN for a hole.
#[inline(always)]
fn bound(density: u16, last_access: f32, clock: BoundClock) -> f64 {
    let stale = clock.0 - f64::from(last_access);
    let density = f64::from(f32::from_bits(u32::from(density) << 16));
    // Divided first and selected after, so that a line's eight vectorise.
    let quotient = density / stale;
    if stale > 0.0 {
        quotient
    } else {
        f64::INFINITY
    }
}

/// A small-candidate threshold in bytes, packed as summaries pack theirs
/// (see [`Summary::held_below`]).
#[derive(Debug, Clone, Copy)]
pub struct HeldThreshold(u16);

impl HeldThreshold {
    /// `bytes` packed.
    pub fn new(bytes: u64) -> HeldThreshold {
        HeldThreshold(pack_held(bytes))
    }
}

/// A clock as [`Summary::cost_density_bound`] reads it: an `f64` not below
/// it, so that the bound, computed in floating point without converting
/// the last access back, stays a bound.
#[derive(Debug, Clone, Copy)]
pub struct BoundClock(f64);

impl BoundClock {
    /// `clock` rounded up.
    pub fn new(clock: u64) -> BoundClock {
        let rounded = clock as f64;
        // u128 holds 2⁶⁴, which u64::MAX rounds to.
        BoundClock(if (rounded as u128) < u128::from(clock) {
            rounded.next_up()
        } else {
            rounded
        })
    }
}

/// Summaries per cache line.
pub(super) const PER_LINE: usize = 8;

/// One cache line of summaries, field by field, so that a search judges
/// its eight lanes at once (see [`Summaries::judge`]).
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
struct Line {
    density: [u16; PER_LINE],
    held: [u16; PER_LINE],
    last_access: [f32; PER_LINE],
}

impl Line {
    const HOLES: Line = Line {
        density: [HOLE_DENSITY; PER_LINE],
        held: [0; PER_LINE],
        last_access: [0.0; PER_LINE],
    };
}

/// What the summaries of one line tell a √N search, lane `i` (position
/// `line · 8 + i`) in bit `i`.
#[derive(Debug, Clone, Copy)]
pub struct LineVerdict {
    /// Lanes holding a member.
    pub members: u8,
    /// Members known to hold fewer bytes than the threshold.
    pub small: u8,
    /// Members whose summary cannot tell (their entry can).
    pub unsure: u8,
    /// Members whose key is 0 (see [`Summary::key_is_zero`]).
    pub zero_key: u8,
}

/// The summaries of a pool's positions, in cache lines: the positions
/// from [`Summaries::len`] to the end of the last line are holes.
#[derive(Debug, Clone, Default)]
pub struct Summaries {
    lines: Vec<Line>,
    len: usize,
}

impl Summaries {
    /// How many positions are summarised.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The summary at `position`: a hole from [`Summaries::len`] to the
    /// end of the last line.
    #[inline]
    pub fn get(&self, position: usize) -> Summary {
        let (line, lane) = (&self.lines[position / PER_LINE], position % PER_LINE);
        Summary {
            density: line.density[lane],
            held: line.held[lane],
            last_access: line.last_access[lane],
        }
    }

    /// What the summaries of line `line` (positions `line · 8` to
    /// `line · 8 + 7`) tell against the small-candidate `threshold`: one
    /// pass over the line's fields, with no branch per lane.
    #[inline(always)]
    pub fn judge(&self, line: usize, threshold: HeldThreshold) -> LineVerdict {
        let line = &self.lines[line];
        let (mut members, mut small, mut unsure, mut zero_key) = (0u8, 0u8, 0u8, 0u8);
        for lane in 0..PER_LINE {
            let (density, held) = (line.density[lane], line.held[lane]);
            members |= u8::from(density != HOLE_DENSITY) << lane;
            small |= u8::from(held < threshold.0) << lane;
            // As in `Summary::held_below`: equal packed bytes tell only
            // when exact.
            unsure |= u8::from(held == threshold.0 && held & ROUNDED_HELD != 0) << lane;
            zero_key |= u8::from(density == 0) << lane;
        }
        LineVerdict {
            members,
            small: small & members,
            unsure: unsure & members,
            zero_key: zero_key & members,
        }
    }

    /// The [`Summary::cost_density_bound`] at `clock` of each lane of line
    /// `line`: one pass the compiler turns into vector code.
    #[inline(always)]
    pub fn bounds(&self, line: usize, clock: BoundClock) -> [f64; PER_LINE] {
        let line = &self.lines[line];
        std::array::from_fn(|lane| bound(line.density[lane], line.last_access[lane], clock))
    }

    /// Starts bringing the line of `position` into the cache.
    #[inline(always)]
    pub(super) fn prefetch(&self, position: usize) {
        super::search::prefetch(&self.lines[position / PER_LINE]);
    }

    /// Appends a summary.
    pub(super) fn push(&mut self, summary: Summary) {
        if self.len.is_multiple_of(PER_LINE) {
            self.lines.push(Line::HOLES);
        }
        self.len += 1;
        self.set(self.len - 1, summary);
    }

    /// Replaces the summary at `position` (below [`Summaries::len`]).
    pub(super) fn set(&mut self, position: usize, summary: Summary) {
        assert!(position < self.len, "a summarised position");
        let (line, lane) = (&mut self.lines[position / PER_LINE], position % PER_LINE);
        line.density[lane] = summary.density;
        line.held[lane] = summary.held;
        line.last_access[lane] = summary.last_access;
    }

    /// The summaries in order.
    pub fn iter(&self) -> impl Iterator<Item = Summary> + '_ {
        (0..self.len).map(|position| self.get(position))
    }
}

impl FromIterator<Summary> for Summaries {
    fn from_iter<I: IntoIterator<Item = Summary>>(summaries: I) -> Summaries {
        let mut all = Summaries::default();
        for summary in summaries {
            all.push(summary);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::StorageId;
    use rand::{Rng, SeedableRng};
    use slotmap::SlotMap;

    /// The range `[low, high)` that the held bytes packed as `packed` lie in
    /// (`high = low + 1` when exact).
    fn held_range(packed: u16) -> (u128, u128) {
        if packed & ROUNDED_HELD == 0 {
            return (u128::from(packed), u128::from(packed) + 1);
        }
        let shift = u32::from(packed >> (HELD_BITS - 1)) & 0x3F;
        let leading = u128::from(packed & ((1 << (HELD_BITS - 1)) - 1)) | 1 << (HELD_BITS - 1);
        (leading << shift, (leading + 1) << shift)
    }

    /// A summary's bound is never above its entry's, whatever the
    /// rounding, and what it tells of the held bytes is true.
    #[test]
    fn summaries_bound_their_entries() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let s = keys.insert(());
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let pick = |rng: &mut rand::rngs::StdRng| match rng.gen_range(0..4) {
            0 => rng.gen_range(0..4u64),
            1 => u64::MAX - rng.gen_range(0..4u64),
            2 => 1 << rng.gen_range(0..64),
            _ => rng.gen::<u64>() >> rng.gen_range(0..64),
        };
        // Of thresholds drawn apart from the held bytes: (how many, told).
        let (mut apart, mut told) = (0, 0);
        for _ in 0..200_000 {
            let candidate = Candidate {
                storage: s,
                held: pick(&mut rng),
                cost: pick(&mut rng),
                last_access: pick(&mut rng),
            };
            let clock = candidate.last_access.saturating_add(pick(&mut rng));
            let extra = if rng.gen() { 0 } else { pick(&mut rng) };
            let summary = Summary::of(&candidate, extra);
            assert!(!summary.is_hole());
            let keyed = Candidate {
                cost: candidate.cost.saturating_add(extra),
                ..candidate
            };
            let (bound, exact) = (
                summary.cost_density_bound(BoundClock::new(clock)),
                keyed.cost_density_bound(clock),
            );
            assert!(
                bound <= exact,
                "{candidate:?} at {clock}: {bound} > {exact}"
            );
            // Thresholds near the held bytes too, where rounding shows.
            let case = rng.gen_range(0..3);
            let threshold = match case {
                0 => pick(&mut rng),
                1 => candidate.held.saturating_add(rng.gen_range(0..3)),
                _ => candidate.held.saturating_sub(rng.gen_range(0..3)),
            };
            let below = summary.held_below(HeldThreshold::new(threshold));
            if let Some(below) = below {
                assert_eq!(below, candidate.held < threshold, "{candidate:?}");
            }
            if case == 0 {
                apart += 1;
                told += usize::from(below.is_some());
            }
            if candidate.held < EXACT_HELD_BELOW {
                assert!(below.is_some());
            }
            // Any key but 0 bounds above 0; a key of 0, at 0 (+∞ unstale).
            if summary.key_is_zero() {
                assert!(bound == 0.0 || bound.is_infinite(), "{candidate:?}");
            } else {
                assert!(bound > 0.0, "{candidate:?}");
            }
        }
        assert!(told * 10 > apart * 9, "the summary tells {told} of {apart}");
    }

    /// Held bytes pack monotonically into a range that holds them and
    /// spans 2⁻⁹ of them.
    #[test]
    fn held_bytes_pack_into_a_tight_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..100_000 {
            let (a, b) = (
                rng.gen::<u64>() >> rng.gen_range(0..64),
                rng.gen::<u64>() >> rng.gen_range(0..64),
            );
            assert!(pack_held(a.min(b)) <= pack_held(a.max(b)), "{a} {b}");
        }
        for held in [
            0,
            1,
            32_767,
            32_768,
            32_769,
            1 << 40,
            (1 << 40) + 12_345,
            u64::MAX,
        ] {
            let (low, high) = held_range(pack_held(held));
            assert!(low <= u128::from(held) && u128::from(held) < high, "{held}");
            let width = if held < EXACT_HELD_BELOW {
                1
            } else {
                low / 512
            };
            assert!(high - low <= width, "{held}: [{low}, {high})");
        }
        assert_eq!(held_range(pack_held(100)), (100, 101));
    }

    /// A line judged at once tells, lane by lane, what each summary tells
    /// alone, and bounds each lane as it does.
    #[test]
    fn a_judged_line_agrees_with_its_summaries() {
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let s = keys.insert(());
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..2_000 {
            let summaries: Summaries = (0..rng.gen_range(1..=16))
                .map(|_| match rng.gen_range(0..6) {
                    0 => Summary::HOLE,
                    _ => Summary::of(
                        &Candidate {
                            storage: s,
                            held: rng.gen_range(0..70_000),
                            cost: rng.gen_range(0..3),
                            last_access: rng.gen_range(0..100),
                        },
                        rng.gen_range(0..2),
                    ),
                })
                .collect();
            let threshold = rng.gen_range(0..70_000);
            let clock = BoundClock::new(rng.gen_range(0..120));
            for line in 0..summaries.len().div_ceil(PER_LINE) {
                let verdict = summaries.judge(line, HeldThreshold::new(threshold));
                let bounds = summaries.bounds(line, clock);
                for (lane, &bound) in bounds.iter().enumerate() {
                    let summary = summaries.get(line * PER_LINE + lane);
                    let bit = |mask: u8| mask & (1 << lane) != 0;
                    let member = !summary.is_hole();
                    let below = summary.held_below(HeldThreshold::new(threshold));
                    assert_eq!(bit(verdict.members), member);
                    assert_eq!(bit(verdict.small), member && below == Some(true));
                    assert_eq!(bit(verdict.unsure), member && below.is_none());
                    assert_eq!(bit(verdict.zero_key), member && summary.key_is_zero());
                    if member {
                        assert_eq!(bound, summary.cost_density_bound(clock));
                    }
                }
            }
        }
    }

    /// Lines hold eight summaries, aligned; positions past the length read
    /// as holes up to the end of the last line.
    #[test]
    fn summaries_fill_aligned_lines() {
        assert_eq!(std::mem::size_of::<Summary>(), 8);
        assert_eq!(std::mem::size_of::<Line>(), 64);
        let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
        let s = keys.insert(());
        let member = |held| {
            Summary::of(
                &Candidate {
                    storage: s,
                    held,
                    cost: 1,
                    last_access: 0,
                },
                0,
            )
        };
        let summaries: Summaries = (1..=9).map(member).collect();
        assert_eq!(summaries.len(), 9);
        assert_eq!(summaries.lines.as_ptr() as usize % 64, 0);
        assert_eq!(summaries.get(8), member(9));
        assert!((9..16).all(|p| summaries.get(p).is_hole()));
        assert_eq!(summaries.iter().count(), 9);
    }
}
