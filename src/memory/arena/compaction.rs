//! Moving blocks to open a hole: what `--memory arena-compact` does when the
//! free bytes would hold an allocation but no single free block does.
//!
//! Two ways to open a hole of the request's length, the one that moves
//! fewer bytes first:
//! - clear a window: of the stretches of that length that start at a
//!   piece's start or end at a piece's end, one whose used blocks
//!   (overlapping it at all) hold the fewest bytes; those blocks go
//!   elsewhere by best fit, which fragmentation may refuse;
//! - slide a run: of the runs of neighbouring pieces whose free bytes add
//!   up to the request, the one with the fewest used bytes; its blocks
//!   slide down to its start, and its free bytes gather at its top. That
//!   always works.
//!
//! A block reserved for an op that has not run yet (no owner) does not
//! move; windows and runs holding one are passed over.

use super::{Arena, Block};
use crate::graph::StorageId;

/// One block moved: its owner, and where it was and is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The storage in the block.
    pub owner: StorageId,
    /// Where it was.
    pub from: Block,
    /// Where it is now (the same size).
    pub to: Block,
}

/// Windows tried, cheapest first, before sliding a run.
const WINDOWS_TRIED: usize = 4;

/// A piece of the address space, as the window search reads it.
#[derive(Clone, Copy)]
struct Span {
    offset: u64,
    end: u64,
    /// Bytes that must move to clear it: 0 for a free piece.
    used: u64,
    /// A used block that cannot move.
    pinned: bool,
}

impl Arena {
    /// Moves blocks so that every one of `sizes` fits at once, if the free
    /// bytes hold them (aligned) and some arrangement of the movable blocks
    /// makes a hole for them moving at most `most_bytes`; the moves made,
    /// in order, or `None` with nothing moved. An empty list when they
    /// already fit.
    pub(crate) fn make_room_by_moving(
        &mut self,
        sizes: &[u64],
        most_bytes: u64,
    ) -> Option<Vec<Move>> {
        let mut total = 0u64;
        for &bytes in sizes {
            total = total.checked_add(self.aligned(bytes)?)?;
        }
        if total > self.capacity - self.in_use {
            return None;
        }
        if self.fits_all(sizes) {
            return Some(Vec::new());
        }
        if most_bytes == 0 {
            // Free pieces are coalesced: a hole that needs no move fits.
            return None;
        }
        let spans = self.spans();
        let run = cheapest_run(&spans, total).filter(|&(cost, _, _)| cost <= most_bytes);
        for (cost, start) in cheapest_windows(&spans, total, self.alignment, self.capacity) {
            if cost > most_bytes {
                break;
            }
            if run.is_some_and(|(run_cost, _, _)| run_cost <= cost) {
                break;
            }
            if let Some(moves) = self.clear_window(start, total) {
                return Some(moves);
            }
        }
        let (_, first, last) = run?;
        let moves = self.slide_down(spans[first].offset, spans[last].end);
        debug_assert!(
            self.fits_all(sizes),
            "a slid run's free bytes hold the request"
        );
        Some(moves)
    }

    /// Moves blocks at once, as a static plan recorded a compaction: each
    /// `(block, offset)` block, a storage's, goes to `offset`. All leave
    /// before any arrives (a window cleared into holes may send one block
    /// where another straddling the window was). `None`, with nothing
    /// changed, when the destinations are not free once they have left.
    pub(crate) fn move_blocks(&mut self, targets: &[(Block, u64)]) -> Option<Vec<Move>> {
        let mut leaving = Vec::with_capacity(targets.len());
        for &(from, to) in targets {
            match self.used.get(&from.offset) {
                Some(&(size, Some(owner))) if size == from.size && size > 0 => {
                    leaving.push((owner, from, to))
                }
                _ => return None,
            }
        }
        let marked = self.marked(leaving.iter().map(|&(_, from, _)| from.offset));
        for &(_, from, _) in &leaving {
            self.free(from);
        }
        let mut moves = Vec::with_capacity(leaving.len());
        for &(owner, from, to) in &leaving {
            match self.allocate_at(to, from.size, Some(owner)) {
                Some(to) => moves.push(Move { owner, from, to }),
                None => {
                    moves.iter().for_each(|m: &Move| self.free(m.to));
                    for &(owner, from, _) in &leaving {
                        self.allocate_at(from.offset, from.size, Some(owner))
                            .expect("a block's old place is free again");
                    }
                    self.lasting.extend(marked);
                    return None;
                }
            }
        }
        self.carry_marks(&moves, &marked);
        Some(moves)
    }

    /// Whether `sizes` would all be placed now (tried, then undone).
    fn fits_all(&mut self, sizes: &[u64]) -> bool {
        let peak = self.peak;
        let fits = match self.allocate_all(sizes) {
            Some(blocks) => {
                blocks.into_iter().for_each(|block| self.free(block));
                true
            }
            None => false,
        };
        self.peak = peak;
        fits
    }

    fn spans(&self) -> Vec<Span> {
        self.pieces()
            .map(|piece| match piece {
                super::Piece::Free { offset, size } => Span {
                    offset,
                    end: offset + size,
                    used: 0,
                    pinned: false,
                },
                super::Piece::Used {
                    offset,
                    size,
                    owner,
                } => Span {
                    offset,
                    end: offset + size,
                    used: size,
                    pinned: owner.is_none(),
                },
            })
            .collect()
    }

    /// Empties `[start, start + length)` by moving its blocks elsewhere (best
    /// fit, largest first); the moves, or `None` with the arena as before.
    fn clear_window(&mut self, start: u64, length: u64) -> Option<Vec<Move>> {
        let end = start + length;
        // Blocks do not overlap: those that end past `start` are the last
        // ones before `end`.
        let mut inside: Vec<(u64, u64, StorageId)> = self
            .used
            .range(..end)
            .rev()
            .take_while(|(&offset, &(size, _))| offset + size > start)
            .map(|(&offset, &(size, owner))| owner.map(|owner| (offset, size, owner)))
            .collect::<Option<_>>()?;
        inside.reverse();
        let marked = self.marked(inside.iter().map(|&(offset, _, _)| offset));
        for &(offset, size, _) in &inside {
            self.free(Block { offset, size });
        }
        let window = self
            .allocate_at(start, length, None)
            .expect("a window of freed blocks and free space is free");
        let mut order: Vec<usize> = (0..inside.len()).collect();
        // Largest first, lowest offset among equals: deterministic.
        order.sort_by_key(|&i| (std::cmp::Reverse(inside[i].1), inside[i].0));
        let mut moves = Vec::with_capacity(inside.len());
        for i in order {
            let (offset, size, owner) = inside[i];
            match self.allocate(size, Some(owner)) {
                Some(to) => moves.push(Move {
                    owner,
                    from: Block { offset, size },
                    to,
                }),
                None => {
                    // Undo: the moved blocks and the window give their
                    // space back, and every block returns where it was.
                    moves.iter().for_each(|m: &Move| self.free(m.to));
                    self.free(window);
                    for &(offset, size, owner) in &inside {
                        self.allocate_at(offset, size, Some(owner))
                            .expect("a block's old place is free again");
                    }
                    self.lasting.extend(marked);
                    return None;
                }
            }
        }
        self.free(window);
        self.carry_marks(&moves, &marked);
        Some(moves)
    }

    /// Slides the blocks in `[start, end)` down to `start`, in address
    /// order (a block never passes an immovable one); the moves made.
    fn slide_down(&mut self, start: u64, end: u64) -> Vec<Move> {
        let mut cursor = start;
        let mut moves = Vec::new();
        let placed: Vec<(u64, u64, Option<StorageId>)> = self
            .used
            .range(start..end)
            .map(|(&offset, &(size, owner))| (offset, size, owner))
            .collect();
        for (offset, size, owner) in placed {
            match owner {
                Some(owner) if offset > cursor => {
                    let from = Block { offset, size };
                    let marked = self.marked([offset]);
                    self.free(from);
                    let to = self
                        .allocate_at(cursor, size, Some(owner))
                        .expect("everything below the cursor's next block is free");
                    let moved = Move { owner, from, to };
                    self.carry_marks(std::slice::from_ref(&moved), &marked);
                    moves.push(moved);
                    cursor += size;
                }
                _ => cursor = offset + size,
            }
        }
        moves
    }
}

/// The run of neighbouring spans with free bytes of at least `length` and
/// no immovable block whose used bytes are fewest (the lowest among
/// equals), as (used bytes, first span, last span); `None` when none.
fn cheapest_run(spans: &[Span], length: u64) -> Option<(u64, usize, usize)> {
    let mut best: Option<(u64, usize, usize)> = None;
    let (mut first, mut free, mut used) = (0, 0u64, 0u64);
    for (last, span) in spans.iter().enumerate() {
        if span.pinned {
            (first, free, used) = (last + 1, 0, 0);
            continue;
        }
        if span.used == 0 {
            free += span.end - span.offset;
        } else {
            used += span.used;
        }
        // Shrink from the left while the run still holds the request.
        while first < last {
            let head = &spans[first];
            let head_free = if head.used == 0 {
                head.end - head.offset
            } else {
                0
            };
            if free - head_free < length {
                break;
            }
            free -= head_free;
            used -= head.used;
            first += 1;
        }
        if free >= length && best.is_none_or(|(cost, _, _)| used < cost) {
            best = Some((used, first, last));
        }
    }
    best
}

/// Where a hole of `length` could be opened, cheapest first (bytes to move,
/// then lowest start), at most [`WINDOWS_TRIED`]: windows that start at a
/// piece's start or end at a piece's end (start rounded down to the
/// alignment), inside the arena, with no immovable block in them.
fn cheapest_windows(spans: &[Span], length: u64, alignment: u64, capacity: u64) -> Vec<(u64, u64)> {
    // moved[i]: bytes of used blocks among spans[..i].
    let mut moved = Vec::with_capacity(spans.len() + 1);
    let mut pinned = Vec::with_capacity(spans.len() + 1);
    moved.push(0u64);
    pinned.push(0u32);
    for span in spans {
        moved.push(moved.last().unwrap() + span.used);
        pinned.push(pinned.last().unwrap() + u32::from(span.pinned));
    }
    // The cost of clearing [start, start + length): every span it overlaps.
    let cost = |start: u64| -> Option<u64> {
        let end = start.checked_add(length).filter(|&end| end <= capacity)?;
        let first = spans.partition_point(|span| span.end <= start);
        let last = spans.partition_point(|span| span.offset < end);
        (pinned[last] == pinned[first]).then(|| moved[last] - moved[first])
    };
    let mut windows: Vec<(u64, u64)> = spans
        .iter()
        .flat_map(|span| {
            let from_end = span.end.checked_sub(length).map(|s| s & !(alignment - 1));
            [Some(span.offset), from_end]
        })
        .flatten()
        .filter_map(|start| Some((cost(start)?, start)))
        .collect();
    windows.sort_unstable();
    windows.dedup();
    windows.truncate(WINDOWS_TRIED);
    windows
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use slotmap::SlotMap;

    fn owners(n: usize) -> Vec<StorageId> {
        let mut map: SlotMap<StorageId, ()> = SlotMap::with_key();
        (0..n).map(|_| map.insert(())).collect()
    }

    #[test]
    fn the_cheapest_window_moves_the_fewest_bytes() {
        let ids = owners(4);
        let mut arena = Arena::new(4096, 256);
        let a = arena.allocate(1024, Some(ids[0])).unwrap();
        let b = arena.allocate(512, Some(ids[1])).unwrap();
        let c = arena.allocate(256, Some(ids[2])).unwrap();
        let d = arena.allocate(512, Some(ids[3])).unwrap();
        let rest = arena.allocate(1792, None).unwrap();
        assert_eq!(
            (a.offset, b.offset, c.offset, d.offset),
            (0, 1024, 1536, 1792)
        );
        assert_eq!(rest.offset, 2304);
        arena.free(b);
        arena.free(d);
        // 1024 bytes free in two holes of 512 on either side of `c`: the
        // cheapest way moves `c` (256 bytes), not `a` (1024): the run of
        // the two holes slides `c` down to 1024 (clearing the window
        // [1024, 2048) would move as much; sliding wins ties: it cannot fail).
        assert!(arena.allocate(1024, None).is_none());
        assert_eq!(arena.make_room_by_moving(&[1024], 255), None);
        let moves = arena.make_room_by_moving(&[1024], 256).unwrap();
        assert_eq!(moves.len(), 1);
        assert_eq!((moves[0].owner, moves[0].from), (ids[2], c));
        assert_eq!(moves[0].to.offset, 1024);
        assert_eq!(arena.allocate(1024, None).unwrap().offset, 1280);
    }

    #[test]
    fn blocks_move_around_pinned_ones_or_not_at_all() {
        let ids = owners(3);
        let mut arena = Arena::new(4096, 256);
        let a = arena.allocate(256, Some(ids[0])).unwrap();
        let b = arena.allocate(1024, Some(ids[1])).unwrap();
        let c = arena.allocate(256, Some(ids[2])).unwrap();
        let pinned = arena.allocate(2304, None).unwrap();
        assert_eq!((c.offset, pinned.offset), (1280, 1536));
        arena.free(a);
        arena.free(b);
        // Free: [0, 1280) and the tail [3840, 4096). The only window
        // without the pinned block is [0, 1536): `c` goes to the tail.
        let moves = arena.make_room_by_moving(&[1536], u64::MAX).unwrap();
        assert_eq!(moves.len(), 1);
        assert_eq!((moves[0].from, moves[0].to.offset), (c, 3840));
        assert_eq!(arena.allocate(1536, None).unwrap().offset, 0);

        // Holes that only a pinned block separates cannot be joined.
        let mut arena = Arena::new(2048, 256);
        let x = arena.allocate(512, Some(ids[0])).unwrap();
        arena.allocate(256, None).unwrap();
        let y = arena.allocate(512, Some(ids[1])).unwrap();
        arena.allocate(768, None).unwrap();
        arena.free(x);
        arena.free(y);
        assert_eq!(arena.make_room_by_moving(&[1024], u64::MAX), None);
        assert_eq!(arena.report().largest_free_bytes, 512);
    }

    #[test]
    fn nothing_moves_when_the_free_bytes_fall_short_or_it_fits() {
        let ids = owners(2);
        let mut arena = Arena::new(1024, 256);
        arena.allocate(512, Some(ids[0])).unwrap();
        assert_eq!(
            arena.make_room_by_moving(&[512], u64::MAX),
            Some(Vec::new())
        );
        assert_eq!(arena.make_room_by_moving(&[768], u64::MAX), None);
        assert_eq!(arena.make_room_by_moving(&[256, 512], u64::MAX), None);
    }

    proptest! {
        /// Random arenas: when the free bytes hold the request and no block
        /// is pinned, moving always makes it fit; blocks keep their sizes
        /// and owners, never overlap, and each move's `from` was where the
        /// block was.
        #[test]
        fn moving_makes_room_whenever_the_free_bytes_allow(
            sizes in prop::collection::vec(1u64..2000, 1..60),
            frees in prop::collection::vec(any::<bool>(), 60),
            request in prop::collection::vec(1u64..3000, 1..4),
        ) {
            let ids = owners(sizes.len());
            let mut arena = Arena::new(64 * 1024, 256);
            let mut live = std::collections::HashMap::new();
            for (i, &bytes) in sizes.iter().enumerate() {
                if let Some(block) = arena.allocate(bytes, Some(ids[i])) {
                    live.insert(ids[i], block);
                }
            }
            for (i, &free) in frees.iter().enumerate().take(sizes.len()) {
                if free {
                    if let Some(block) = live.remove(&ids[i]) {
                        arena.free(block);
                    }
                }
            }
            let total: u64 = request.iter().map(|&b| arena.aligned(b).unwrap()).sum();
            let free_bytes = arena.capacity() - arena.report().in_use_bytes;
            match arena.make_room_by_moving(&request, u64::MAX) {
                Some(moves) => {
                    for m in &moves {
                        prop_assert_eq!(live.get(&m.owner).copied(), Some(m.from));
                        prop_assert_eq!(m.from.size, m.to.size);
                        live.insert(m.owner, m.to);
                    }
                    let placed = arena.allocate_all(&request);
                    prop_assert!(placed.is_some());
                }
                None => prop_assert!(total > free_bytes),
            }
            let mut blocks: Vec<Block> = live.values().copied().collect();
            blocks.sort_by_key(|b| b.offset);
            for pair in blocks.windows(2) {
                prop_assert!(pair[0].offset + pair[0].size <= pair[1].offset);
            }
            for piece in arena.pieces() {
                if let super::super::Piece::Used { offset, size, owner: Some(owner) } = piece {
                    prop_assert_eq!(live.get(&owner).copied(), Some(Block { offset, size }));
                }
            }
        }
    }
}
