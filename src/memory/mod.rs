//! Memory against the budget, under one of two models.
//!
//! `counter` adds up bytes, as the DTR authors' simulator does. `arena`
//! places every storage at an offset inside one address space of exactly
//! the budget ([`arena::Arena`]), so fragmentation can refuse an allocation
//! that the counter would allow.

pub mod arena;
mod counter;
pub mod packing;

pub use arena::{Arena, ArenaReport, Block, Move, Piece};
pub use counter::MemoryCounter;

use crate::graph::StorageId;

/// Which memory model to use. Written `counter`, `arena` (256-byte
/// alignment) or `arena:ALIGNMENT`, `arena-ff[:ALIGNMENT]`,
/// `arena-split[:ALIGNMENT]`, `arena-compact[:ALIGNMENT]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum MemoryModel {
    /// Bytes added up against the budget; no addresses, no fragmentation.
    #[default]
    Counter,
    /// An offset allocator with blocks aligned to `alignment` bytes.
    Arena {
        /// Block alignment in bytes (a power of two).
        alignment: u64,
    },
    /// The same placing each block at the lowest offset where it fits
    /// (see `Arena::allocate`). Written `arena-ff` or `arena-ff:ALIGNMENT`.
    FirstFitArena {
        /// Block alignment in bytes (a power of two).
        alignment: u64,
    },
    /// The same placing small blocks (under 1/64 of the arena) at the top
    /// end of the highest free block that holds them, large ones best fit
    /// (see `Arena::allocate`). Written `arena-split` or
    /// `arena-split:ALIGNMENT`.
    SplitArena {
        /// Block alignment in bytes (a power of two).
        alignment: u64,
    },
    /// The best-fit arena that, when the free bytes would hold an
    /// allocation but no free block does, moves blocks to open a hole
    /// instead of evicting (see `Arena::make_room_by_moving`); each move
    /// costs its bytes at [`Config::move_bandwidth`](crate::Config::move_bandwidth).
    /// Written `arena-compact` or `arena-compact:ALIGNMENT`.
    CompactingArena {
        /// Block alignment in bytes (a power of two).
        alignment: u64,
    },
}

impl MemoryModel {
    /// The arena with the default 256-byte alignment.
    pub fn arena() -> MemoryModel {
        MemoryModel::Arena { alignment: 256 }
    }
}

impl std::fmt::Display for MemoryModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            MemoryModel::Counter => f.write_str("counter"),
            MemoryModel::Arena { alignment: 256 } => f.write_str("arena"),
            MemoryModel::Arena { alignment } => write!(f, "arena:{alignment}"),
            MemoryModel::FirstFitArena { alignment: 256 } => f.write_str("arena-ff"),
            MemoryModel::FirstFitArena { alignment } => write!(f, "arena-ff:{alignment}"),
            MemoryModel::SplitArena { alignment: 256 } => f.write_str("arena-split"),
            MemoryModel::SplitArena { alignment } => write!(f, "arena-split:{alignment}"),
            MemoryModel::CompactingArena { alignment: 256 } => f.write_str("arena-compact"),
            MemoryModel::CompactingArena { alignment } => write!(f, "arena-compact:{alignment}"),
        }
    }
}

impl std::str::FromStr for MemoryModel {
    type Err = String;

    fn from_str(text: &str) -> std::result::Result<MemoryModel, String> {
        match text.split_once(':') {
            None if text == "counter" => Ok(MemoryModel::Counter),
            None if text == "arena" => Ok(MemoryModel::arena()),
            None if text == "arena-ff" => Ok(MemoryModel::FirstFitArena { alignment: 256 }),
            None if text == "arena-split" => Ok(MemoryModel::SplitArena { alignment: 256 }),
            None if text == "arena-compact" => Ok(MemoryModel::CompactingArena { alignment: 256 }),
            Some((kind @ ("arena" | "arena-ff" | "arena-split" | "arena-compact"), alignment)) => {
                match alignment.parse::<u64>() {
                    Ok(alignment) if alignment.is_power_of_two() => Ok(match kind {
                        "arena" => MemoryModel::Arena { alignment },
                        "arena-ff" => MemoryModel::FirstFitArena { alignment },
                        "arena-split" => MemoryModel::SplitArena { alignment },
                        _ => MemoryModel::CompactingArena { alignment },
                    }),
                    _ => Err(format!(
                        "arena alignment `{alignment}` is not a power of two"
                    )),
                }
            }
            _ => Err(format!(
                "unknown memory model `{text}` (counter, arena, arena-ff, arena-split or arena-compact, \
                 each arena optionally with :ALIGNMENT)"
            )),
        }
    }
}

impl From<MemoryModel> for String {
    fn from(memory: MemoryModel) -> String {
        memory.to_string()
    }
}

impl TryFrom<String> for MemoryModel {
    type Error = String;

    fn try_from(text: String) -> std::result::Result<MemoryModel, String> {
        text.parse()
    }
}

/// Bytes in use (counted as allocated, aligned in arena mode), and the
/// arena when there is one.
#[derive(Debug, Clone)]
pub struct Memory {
    model: MemoryModel,
    counter: MemoryCounter,
    arena: Option<Arena>,
    /// A static plan's offsets, in allocation order: the arena places each
    /// allocation at the next one instead of choosing.
    planned: Option<std::collections::VecDeque<u64>>,
}

impl Memory {
    /// An arena needs a budget; until it has one the model is a counter.
    pub(crate) fn new(model: MemoryModel, budget_bytes: Option<u64>) -> Memory {
        let mut memory = Memory {
            model,
            counter: MemoryCounter::new(budget_bytes),
            arena: None,
            planned: None,
        };
        memory.open_arena();
        memory
    }

    /// Creates the arena once there is a budget and nothing is placed yet
    /// (existing storages have no addresses to move into it).
    fn open_arena(&mut self) {
        let alignment = match self.model {
            MemoryModel::Counter => return,
            MemoryModel::Arena { alignment }
            | MemoryModel::FirstFitArena { alignment }
            | MemoryModel::SplitArena { alignment }
            | MemoryModel::CompactingArena { alignment } => alignment,
        };
        if let (Some(budget), None) = (self.counter.budget_bytes(), &self.arena) {
            if self.counter.in_use_bytes() == 0 {
                let arena = Arena::new(budget, alignment);
                self.arena = Some(match self.model {
                    MemoryModel::FirstFitArena { .. } => arena.first_fit(),
                    MemoryModel::SplitArena { .. } => arena.split(),
                    _ => arena,
                });
            }
        }
    }

    /// Bytes in use, the peak and the budget.
    pub fn counter(&self) -> &MemoryCounter {
        &self.counter
    }

    /// The arena, in arena memory once there is a budget (`None` otherwise).
    pub fn arena(&self) -> Option<&Arena> {
        self.arena.as_ref()
    }

    /// Whether the arena moves blocks to open room (`arena-compact`), so
    /// that scattered free bytes are not lost.
    pub fn moves_blocks(&self) -> bool {
        matches!(self.model, MemoryModel::CompactingArena { .. })
    }

    /// A new budget; an existing arena grows to it, or shrinks as far as its
    /// free tail allows; without a budget it no longer limits anything.
    pub(crate) fn set_budget_bytes(&mut self, budget_bytes: Option<u64>) {
        self.counter.set_budget_bytes(budget_bytes);
        match (&mut self.arena, budget_bytes) {
            (Some(arena), Some(budget)) => {
                arena.resize(budget);
            }
            (None, Some(_)) => self.open_arena(),
            // Unbounded: addresses stay, space is no longer the limit.
            (Some(arena), None) => {
                arena.resize(u64::MAX / 4);
            }
            (None, None) => {}
        }
    }

    /// Places the following allocations at `offsets`, in order (a static
    /// plan's), in arena memory.
    pub(crate) fn follow_offsets(&mut self, offsets: Vec<u64>) {
        self.planned = Some(offsets.into());
    }

    /// Planned offsets not used yet.
    pub(crate) fn planned_offsets_left(&self) -> usize {
        self.planned.as_ref().map_or(0, |offsets| offsets.len())
    }

    /// Allocates a block for each size, or nothing when they do not all fit.
    /// Following a plan, each goes at its planned offset or none is made.
    /// In an arena, sizes marked in `lasting` (one mark per size, or none)
    /// are placed apart (see [`Arena::allocate_all_lasting`]).
    pub(crate) fn allocate_all(&mut self, sizes: &[u64], lasting: &[bool]) -> Option<Vec<Block>> {
        let blocks = match (&mut self.arena, &mut self.planned) {
            (Some(arena), Some(planned)) => {
                if planned.len() < sizes.len() {
                    return None;
                }
                let blocks = arena.allocate_all_at(sizes, planned.make_contiguous())?;
                planned.drain(..sizes.len());
                blocks
            }
            (Some(arena), None) => arena.allocate_all_lasting(sizes, lasting)?,
            (None, _) => {
                let total = sizes.iter().fold(0u64, |sum, &b| sum.saturating_add(b));
                if !self.counter.fits(total) {
                    return None;
                }
                sizes
                    .iter()
                    .map(|&size| Block { offset: 0, size })
                    .collect()
            }
        };
        for block in &blocks {
            self.counter.allocate(block.size);
        }
        Some(blocks)
    }

    /// Whether evicting could ever make `sizes` fit: the bytes (aligned)
    /// that no eviction can free plus the request stay within the budget.
    pub(crate) fn could_fit(&self, sizes: &[u64], unevictable_bytes: u64) -> bool {
        let request = sizes.iter().fold(0u64, |sum, &b| {
            let size = self
                .arena
                .as_ref()
                .map_or(Some(b), |a| a.aligned(b))
                .unwrap_or(u64::MAX);
            sum.saturating_add(size)
        });
        self.counter
            .budget_bytes()
            .is_none_or(|budget| unevictable_bytes.saturating_add(request) <= budget)
    }

    /// In a compacting arena, moves at most `most_bytes` so that `sizes`
    /// fit when the free bytes hold them but no free block does; the moves
    /// made, or `None` (other models, or no such arrangement: nothing moved).
    pub(crate) fn make_room_by_moving(
        &mut self,
        sizes: &[u64],
        most_bytes: u64,
    ) -> Option<Vec<Move>> {
        match (self.model, &mut self.arena, &self.planned) {
            (MemoryModel::CompactingArena { .. }, Some(arena), None) => {
                arena.make_room_by_moving(sizes, most_bytes)
            }
            _ => None,
        }
    }

    /// Moves arena blocks at once, as a static plan says (see
    /// [`Arena::move_blocks`]); `None` without an arena or where they cannot go.
    pub(crate) fn move_blocks(&mut self, targets: &[(Block, u64)]) -> Option<Vec<Move>> {
        self.arena.as_mut()?.move_blocks(targets)
    }

    pub(crate) fn free(&mut self, block: Block) {
        self.counter.free(block.size);
        if let Some(arena) = &mut self.arena {
            arena.free(block);
        }
    }

    pub(crate) fn set_owner(&mut self, block: Block, owner: Option<StorageId>) {
        if let Some(arena) = &mut self.arena {
            arena.set_owner(block, owner);
        }
    }

    /// Free bytes adjacent to a block (0 without an arena).
    pub fn free_neighbours(&self, block: Block) -> u64 {
        self.arena
            .as_ref()
            .map_or(0, |arena| arena.free_neighbours(block))
    }
}
