//! Static plans from a DTR run: recording which storages each reservation
//! evicted and, in a compacting arena, which blocks it moved where (and, in
//! the storage table, every allocation's lifetime), and following such a
//! record with no policy at all.

use std::collections::VecDeque;

use super::eviction::RoomFor;
use super::Interpreter;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::graph::{StorageId, TensorId};
use crate::memory::packing::Lifetime;
use crate::memory::{Block, Move};

/// A schedule being recorded or followed.
pub(super) enum Schedule {
    Record {
        /// The reservations so far.
        done: Vec<Reservation>,
        /// The reservation under way.
        current: Reservation,
    },
    Follow {
        /// The reservations to come.
        planned: VecDeque<Reservation>,
        /// Reservations made so far.
        reservation: usize,
    },
}

/// One request for memory in a recorded run: the storages it evicted, by
/// root tensor, the blocks it then moved (a compacting arena's), and
/// whether it then ran out of memory (an op that then got room by lock
/// relaxation asks again).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reservation {
    /// The storages evicted for it, by root tensor, in order.
    pub victims: Vec<TensorId>,
    /// The blocks moved for it after the evictions, in order.
    pub moves: Vec<BlockMove>,
    /// It failed even after evicting them.
    pub out_of_memory: bool,
    /// It reserved an op's outputs before the op's inputs were restored
    /// again, after fragmentation left the op no room (see
    /// [`Stats::outputs_reserved_first`](crate::Stats::outputs_reserved_first)).
    pub outputs_first: bool,
}

/// A resident storage's block moved to open a hole, as a reservation of a
/// recorded run in a compacting arena moved it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockMove {
    /// The storage, by root tensor.
    pub tensor: TensorId,
    /// Its block, by allocation (an index into [`PlanRecord::lifetimes`]).
    pub allocation: usize,
    /// The offset it moved to.
    pub to: u64,
}

/// What a run recorded for a static plan: its reservations, and every
/// allocation's lifetime, in the order they were made.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanRecord {
    /// Every reservation, in order.
    pub reservations: Vec<Reservation>,
    /// Every allocation, in reservation steps.
    pub lifetimes: Vec<Lifetime>,
    /// Where each allocation was placed, in the same order: the arena's
    /// offsets in arena memory (a placement the run itself proved, with
    /// the reservations' moves), 0 in counter memory.
    pub offsets: Vec<u64>,
}

impl<B: Backend> Interpreter<B> {
    /// Starts recording the schedule this run executes, for
    /// [`Interpreter::plan_record`]. Only before the first instruction.
    pub fn record_plan(&mut self) -> Result<()> {
        self.before_any_instruction("record_plan")?;
        self.schedule = Some(Schedule::Record {
            done: Vec::new(),
            current: Reservation::default(),
        });
        self.table.record_lifetimes();
        Ok(())
    }

    /// The schedule recorded since [`Interpreter::record_plan`].
    pub fn plan_record(&self) -> Option<PlanRecord> {
        match &self.schedule {
            Some(Schedule::Record { done, .. }) => Some(PlanRecord {
                reservations: done.clone(),
                lifetimes: self.table.lifetimes(),
                offsets: self.table.offsets(),
            }),
            _ => None,
        }
    }

    /// Follows a recorded schedule instead of a policy: each reservation
    /// evicts exactly its recorded victims (and fails where the recorded
    /// one did), and (in arena memory, with `offsets`) makes its recorded
    /// moves and places each allocation at its planned offset. A program
    /// that departs from the plan gets an error naming the reservation.
    /// Only before the first instruction.
    pub fn follow_plan(
        &mut self,
        reservations: Vec<Reservation>,
        offsets: Option<Vec<u64>>,
    ) -> Result<()> {
        self.before_any_instruction("follow_plan")?;
        if let Some(offsets) = offsets {
            if self.table.memory().arena().is_none() {
                return Err(Error::InvalidArgument(
                    "planned offsets need arena memory with a budget".into(),
                ));
            }
            self.table.follow_offsets(offsets);
        }
        self.schedule = Some(Schedule::Follow {
            planned: reservations.into(),
            reservation: 0,
        });
        Ok(())
    }

    /// Whether a followed plan was used up exactly: every reservation's
    /// victims evicted and every planned offset taken.
    pub fn plan_finished(&self) -> bool {
        let offsets_left = self.table.memory().planned_offsets_left();
        match &self.schedule {
            Some(Schedule::Follow { planned, .. }) => planned.is_empty() && offsets_left == 0,
            _ => offsets_left == 0,
        }
    }

    fn before_any_instruction(&self, what: &str) -> Result<()> {
        if self.graph.tensors.is_empty() && self.observers.stats.ops == 0 {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: only before the first instruction"
            )))
        }
    }

    /// Notes a victim chosen by the policy (recording).
    pub(super) fn schedule_victim(&mut self, root: TensorId) {
        if let Some(Schedule::Record { current, .. }) = &mut self.schedule {
            current.victims.push(root);
            // Moved, then evicted: a follower evicts it before any move.
            current.moves.retain(|m| m.tensor != root);
        }
    }

    /// Notes the blocks a compaction moved (recording).
    pub(super) fn schedule_moves(&mut self, moves: &[Move]) {
        if let Some(Schedule::Record { current, .. }) = &mut self.schedule {
            for m in moves {
                let allocation = self
                    .table
                    .allocation_of(m.owner)
                    .expect("a moved block is a recorded allocation");
                current.moves.push(BlockMove {
                    tensor: self.graph.storages[m.owner].tensors[0],
                    allocation,
                    to: m.to.offset,
                });
            }
        }
    }

    /// Closes the reservation under way (recording).
    pub(super) fn schedule_reserved(&mut self, out_of_memory: bool) {
        if let Some(Schedule::Record { done, current }) = &mut self.schedule {
            done.push(Reservation {
                out_of_memory,
                ..std::mem::take(current)
            });
        }
    }

    /// How many reservations are recorded so far (0 when not recording).
    pub(super) fn recorded_reservations(&self) -> usize {
        match &self.schedule {
            Some(Schedule::Record { done, .. }) => done.len(),
            _ => 0,
        }
    }

    /// Marks the reservation recorded as the `k`th, if there is one, as
    /// one of an op's outputs made before its inputs are restored again.
    pub(super) fn schedule_outputs_first(&mut self, k: usize) {
        if let Some(Schedule::Record { done, .. }) = &mut self.schedule {
            if let Some(reservation) = done.get_mut(k) {
                reservation.outputs_first = true;
            }
        }
    }

    /// Whether the plan being followed reserves an op's outputs before its
    /// inputs next (its recorded run did so there).
    pub(super) fn plan_reserves_outputs_first(&self) -> bool {
        match &self.schedule {
            Some(Schedule::Follow { planned, .. }) => {
                planned.front().is_some_and(|next| next.outputs_first)
            }
            _ => false,
        }
    }

    /// A tensor as a plan file names it (its id there), and the op that
    /// made it when the program has it.
    fn plan_tensor(&self, tensor: TensorId) -> String {
        use slotmap::Key;
        let id = tensor.data().as_ffi();
        match self.graph.tensors.get(tensor) {
            Some(t) => match t.producer {
                Some(node) => format!(
                    "tensor {id} (an output of `{}`)",
                    self.graph.nodes[node].op().name()
                ),
                None => format!("tensor {id} (a put)"),
            },
            None => format!("tensor {id} (not in the program)"),
        }
    }

    pub(super) fn follows_plan(&self) -> bool {
        matches!(self.schedule, Some(Schedule::Follow { .. }))
    }

    /// A reservation by the plan: its victims, its moves, then its blocks
    /// (or the out-of-memory error the recorded run got).
    pub(super) fn reserve_as_planned(
        &mut self,
        sizes: &[u64],
        purpose: RoomFor<'_>,
    ) -> Result<Vec<Block>> {
        let Some(Schedule::Follow {
            planned,
            reservation,
        }) = &mut self.schedule
        else {
            unreachable!("only called when following a plan");
        };
        let k = *reservation;
        *reservation += 1;
        let planned = planned.pop_front().unwrap_or_default();
        let broken = |why: String| {
            Error::InvalidArgument(format!(
                "the program departs from the plan at reservation {k}: {why}"
            ))
        };
        for root in planned.victims {
            let storage = self.graph.tensors.get(root).map(|t| t.storage);
            match storage {
                Some(storage) if self.table.can_evict(&self.graph, storage) => {
                    self.evict(storage, false, None)
                }
                _ => {
                    return Err(broken(format!(
                        "victim {} is not evictable",
                        self.plan_tensor(root)
                    )))
                }
            }
        }
        // Evicting first only frees more room for the moves (a block moved
        // and then evicted is not among them), and the moves go at once: a
        // reservation's destinations are free once all its moved blocks left.
        let mut targets: Vec<(StorageId, u64)> = Vec::with_capacity(planned.moves.len());
        for planned_move in &planned.moves {
            let storage = (self.graph.tensors.get(planned_move.tensor)).map(|t| t.storage);
            let Some(storage) = storage.filter(|&s| self.graph.storages[s].is_resident()) else {
                return Err(broken(format!(
                    "{} is not resident to move",
                    self.plan_tensor(planned_move.tensor)
                )));
            };
            match targets.iter_mut().find(|(s, _)| *s == storage) {
                Some(target) => target.1 = planned_move.to,
                None => targets.push((storage, planned_move.to)),
            }
        }
        if !targets.is_empty() {
            let Some(moves) = self.table.move_blocks(&targets) else {
                return Err(broken(format!(
                    "blocks cannot move to offsets {:?}",
                    targets.iter().map(|t| t.1).collect::<Vec<_>>()
                )));
            };
            self.charge_moves(&moves);
        }
        if planned.out_of_memory {
            return Err(self.out_of_memory(sizes, purpose));
        }
        self.table.reserve(sizes, &[]).ok_or_else(|| {
            broken(format!(
                "{sizes:?} B do not fit{}",
                if self.table.memory().arena().is_some() {
                    " at their planned offsets"
                } else {
                    ""
                }
            ))
        })
    }
}
