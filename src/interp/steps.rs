//! Step plans: a training loop runs the same step again and again, so the
//! evictions one step's policy chose can be made by the next step with no
//! policy at all (no scoring, no search).
//!
//! Every step is recorded: for each request for memory that evicted, which
//! storages it evicted, each named by the op of the step that made it (its
//! position among the step's ops) and the output. The next step follows
//! that record while the program repeats it: a request is the recorded one
//! when the same ops came before it (their count, and a fingerprint of
//! their names and sizes), it is as many requests after the last op and
//! it asks the same bytes; then the step evicts the recorded victims and
//! takes the room. The moment the program departs from it — other ops,
//! other sizes — the policy takes over for the rest of the step, and that
//! step's record becomes the plan of the next.
//!
//! The same program can meet a different memory state: a tensor the
//! program frees later than last time, a victim already evicted, a cost
//! measured differently the step before (the policy's choices, and so the
//! state a step leaves, depend on measured costs in PyTorch). It may then
//! rematerialise more or less than the recorded step (requests the plan
//! does not know of, or recorded ones that do not come: passed over once
//! the next op runs), and a request the plan gave room to can fall short:
//! the policy *repairs* it, evicting what is still missing for that request
//! alone, and the step goes on following its plan. Eviction never changes
//! values, so a plan that does not fit any more costs recomputation, never
//! correctness.

use std::hash::BuildHasher;

use slotmap::SecondaryMap;

use super::{Interpreter, RunEvent};
use crate::backend::Backend;
use crate::graph::{NodeId, StorageId, TensorId};
use crate::memory::Block;

/// A tensor of a step (one it evicted or read), as the next step can name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum StepTensor {
    /// Output `output` of the step's op number `op` (counted from 0).
    Made { op: u32, output: u32 },
    /// A tensor made before the step (the same tensor in the next step, if
    /// it is still there).
    Earlier(TensorId),
}

/// One request for memory of a step that evicted.
#[derive(Debug, Clone, PartialEq)]
struct StepReservation {
    /// Its position among the step's requests.
    request: u32,
    /// Its position among the requests since the step's last op.
    op_request: u32,
    /// Ops applied in the step before it.
    ops: u32,
    /// The fingerprint of those ops.
    fingerprint: u64,
    /// Bytes asked for.
    bytes: u64,
    /// What it evicted, in order.
    victims: Vec<StepTensor>,
    /// It then ran out of memory (an op that then got room by relaxing
    /// locks asks again).
    out_of_memory: bool,
}

/// The last step's record (the plan) and the step under way.
#[derive(Default)]
pub(super) struct StepPlans {
    /// The previous step's evicting requests, followed by this step.
    plan: Vec<StepReservation>,
    /// The previous step's op count and fingerprint: a step that followed
    /// its plan repeated it only if it ends with the same.
    plan_program: (u32, u64),
    /// How many of `plan`'s requests this step has matched or passed over;
    /// `None` once it departed from the plan (or there was none).
    followed: Option<usize>,
    /// This step's evicting requests so far: the next step's plan.
    record: Vec<StepReservation>,
    /// Requests for memory made in this step, and since its last op.
    requests: u32,
    op_requests: u32,
    /// This step's ops, by position, and each one's position.
    ops: Vec<NodeId>,
    positions: SecondaryMap<NodeId, u32>,
    /// A running hash of this step's ops (names and output bytes).
    fingerprint: u64,
    /// The budget changed during this step: its record is no plan.
    budget_changed: bool,
    /// Requests of this step the plan left short, for the policy to finish.
    repairs: u32,
}

impl StepPlans {
    /// Starts a step that follows `plan` (when it has one), recorded from
    /// a step of `program` (op count, fingerprint).
    fn next_step(&mut self, plan: Vec<StepReservation>, program: (u32, u64)) {
        *self = StepPlans {
            followed: Some(0),
            plan,
            plan_program: program,
            ops: std::mem::take(&mut self.ops),
            positions: std::mem::take(&mut self.positions),
            ..StepPlans::default()
        };
        self.ops.clear();
        self.positions.clear();
    }

    /// What the plan says of the request under way, for `bytes`. Requests
    /// are matched by their op and their position and size since it: a step
    /// that meets other memory may rematerialise more or less than the
    /// recorded one, so the count of requests drifts, while the ops do not.
    fn planned_now(&mut self, bytes: u64) -> PlanSays<'_> {
        let Some(followed) = &mut self.followed else {
            return PlanSays::Nothing;
        };
        let ops = self.ops.len() as u32;
        // Requests of ops already past did not come again (the recorded
        // step rematerialised something this one still holds): passed over.
        while self.plan.get(*followed).is_some_and(|next| next.ops < ops) {
            *followed += 1;
        }
        let Some(next) = self.plan.get(*followed) else {
            return PlanSays::FitAsIs;
        };
        if next.ops > ops || next.op_request != self.op_requests || next.bytes != bytes {
            PlanSays::FitAsIs
        } else if next.fingerprint != self.fingerprint {
            PlanSays::Departed("other ops than the plan's")
        } else {
            PlanSays::Evict(next)
        }
    }
}

/// What the plan says of one request for memory.
enum PlanSays<'a> {
    /// No plan is followed.
    Nothing,
    /// The plan evicted nothing for it: it fits as it is.
    FitAsIs,
    /// Evict its victims, then it fits (or runs out of memory, as recorded).
    Evict(&'a StepReservation),
    /// The step is not the plan's any more.
    Departed(&'static str),
}

/// What a step plan says of one request for memory.
pub(super) enum Planned {
    /// Not following a plan (none, or the step departed from it).
    No,
    /// The plan made room for it: these blocks.
    Room(Vec<Block>),
    /// The plan evicted what the recorded step did, which then ran out of
    /// memory here (and went on by relaxing locks).
    OutOfMemory,
}

impl<B: Backend> Interpreter<B> {
    /// Ends a step of a program that repeats (a training step). Each step
    /// after the first mark is recorded: which storages each request for
    /// memory evicted. The next step follows that record with no policy
    /// while it repeats the step (the same ops and sizes); from the first
    /// difference in the program the policy takes over for the rest of the
    /// step, and that step's record becomes the plan. Where only the memory
    /// state differs (the plan's room falls short) the policy repairs that
    /// one request and the step keeps following. Values never depend on it;
    /// [`Stats::planned_steps`] counts the steps that followed their plan to
    /// the end, [`Stats::plan_repairs`] the requests repaired. Changing the
    /// budget drops the plan. An error while a static plan is recorded or
    /// followed ([`Interpreter::record_plan`]).
    ///
    /// Under a heuristic that looks ahead (`dtr-next`), each step also
    /// tells the next when it reads each tensor, while the next repeats it:
    /// the step after the recorded one evicts by that foresight, and only
    /// its record, made with foresight, becomes a plan to follow.
    ///
    /// [`Stats::planned_steps`]: crate::Stats::planned_steps
    /// [`Stats::plan_repairs`]: crate::Stats::plan_repairs
    pub fn mark_step(&mut self) -> crate::Result<()> {
        if self.schedule.is_some() {
            return Err(crate::Error::InvalidArgument(
                "mark_step: a static plan is being recorded or followed".into(),
            ));
        }
        // A step that could have looked ahead and did not is no plan.
        let informed = self.lookahead_next_step().unwrap_or(true);
        let steps = self.steps.get_or_insert_with(Default::default);
        // Followed to the end: never departed, over the same ops. (Requests
        // of the last op the plan had and this step did not are passed over.)
        let program = (steps.ops.len() as u32, steps.fingerprint);
        let followed =
            steps.followed.is_some() && !steps.plan.is_empty() && program == steps.plan_program;
        let repairs = if followed { steps.repairs } else { 0 };
        let plan = if steps.budget_changed || !informed {
            Vec::new()
        } else {
            std::mem::take(&mut steps.record)
        };
        steps.next_step(plan, program);
        self.observers
            .notify(&RunEvent::StepEnded { followed, repairs }, &self.graph);
        Ok(())
    }

    /// Forgets the step plan (the budget changed, so the old choices may no
    /// longer fit or may waste the new room).
    pub(super) fn drop_step_plan(&mut self) {
        if let Some(steps) = &mut self.steps {
            steps.plan.clear();
            steps.followed = None;
            steps.budget_changed = true;
        }
    }

    /// Notes an op the program applied, for naming victims and checking
    /// that a step repeats the plan's.
    pub(super) fn step_op(&mut self, node: NodeId) {
        let Some(steps) = &mut self.steps else {
            return;
        };
        let info = &self.graph.nodes[node];
        let position = steps.ops.len() as u32;
        steps.ops.push(node);
        steps.positions.insert(node, position);
        steps.op_requests = 0;
        let state = foldhash::fast::FixedState::with_seed(steps.fingerprint);
        steps.fingerprint = state.hash_one((info.op().name(), info.signature().output_bytes()));
        let fingerprint = steps.fingerprint;
        self.lookahead_op_starts(position as usize, fingerprint);
    }

    /// A request for `sizes` (`bytes` in all) as the step plan says: when
    /// the plan's next evicting request is this one, evicts its victims
    /// (those still evictable) and takes the room. Other ops than the
    /// plan's end following for this step; room still short is repaired:
    /// the policy makes the rest of the room, from the state the plan's
    /// evictions left, and the step goes on following.
    pub(super) fn reserve_by_step_plan(&mut self, sizes: &[u64], bytes: u64) -> Planned {
        let Some(steps) = &mut self.steps else {
            return Planned::No;
        };
        let (victims, out_of_memory) = match steps.planned_now(bytes) {
            PlanSays::Nothing => return Planned::No,
            PlanSays::Departed(why) => return self.depart_from_step_plan(why),
            PlanSays::FitAsIs => {
                return match self.table.reserve(sizes, &[]) {
                    Some(blocks) => Planned::Room(blocks),
                    None => self.repair_step_plan("a request the plan evicted nothing for"),
                };
            }
            PlanSays::Evict(planned) => (planned.victims.clone(), planned.out_of_memory),
        };
        if let Some(StepPlans {
            followed: Some(followed),
            ..
        }) = &mut self.steps
        {
            *followed += 1;
        }
        for victim in victims {
            // One already evicted, or in use now, is passed over: if the
            // room falls short for it, the repair makes up the difference.
            if let Some(storage) = self.step_victim_storage(victim) {
                if self.table.can_evict(&self.graph, storage) {
                    self.evict(storage, false, None);
                    self.step_victim(storage);
                }
            }
        }
        match self.table.reserve(sizes, &[]) {
            Some(blocks) => Planned::Room(blocks),
            // As the recorded step did; one that meets more room than it
            // did gets the room instead.
            None if out_of_memory => Planned::OutOfMemory,
            None => self.repair_step_plan("the planned victims did not make room"),
        }
    }

    /// The step follows its plan, but the room the plan made for this
    /// request falls short: the policy makes the rest (its victims are
    /// recorded with the plan's), and the step goes on following.
    fn repair_step_plan(&mut self, why: &'static str) -> Planned {
        if let Some(steps) = &mut self.steps {
            tracing::debug!(target: "dtr::evict", why, request = steps.requests, "the step's plan falls short; the policy repairs this request");
            steps.repairs += 1;
        }
        Planned::No
    }

    fn depart_from_step_plan(&mut self, why: &'static str) -> Planned {
        if let Some(steps) = &mut self.steps {
            tracing::debug!(target: "dtr::evict", why, request = steps.requests, "the step departs from its plan; the policy takes over");
            steps.followed = None;
        }
        Planned::No
    }

    /// The storage a plan's victim names now, if it exists.
    fn step_victim_storage(&self, victim: StepTensor) -> Option<StorageId> {
        let tensor = match victim {
            StepTensor::Made { op, output } => {
                let node = *self.steps.as_ref()?.ops.get(op as usize)?;
                self.graph.nodes.get(node)?.output(output as usize)?
            }
            StepTensor::Earlier(tensor) => tensor,
        };
        Some(self.graph.tensors.get(tensor)?.storage)
    }

    /// `tensor` as the next step can name it: by the op of this step that
    /// made it, or as itself when it was made before the step.
    pub(super) fn step_tensor(&self, tensor: TensorId) -> Option<StepTensor> {
        let steps = self.steps.as_ref()?;
        let info = &self.graph.tensors[tensor];
        let made = info
            .producer
            .and_then(|node| Some((*steps.positions.get(node)?, info.output)));
        Some(match made {
            Some((op, output)) => StepTensor::Made {
                op,
                output: u32::from(output),
            },
            None => StepTensor::Earlier(tensor),
        })
    }

    /// Notes a storage the policy or the plan evicted for the request under way.
    pub(super) fn step_victim(&mut self, storage: StorageId) {
        let Some(victim) = self.step_tensor(self.graph.storages[storage].tensors[0]) else {
            return;
        };
        let Some(steps) = &mut self.steps else {
            return;
        };
        let request = steps.requests;
        match steps.record.last_mut() {
            Some(open) if open.request == request => open.victims.push(victim),
            _ => {
                let reservation = StepReservation {
                    request,
                    op_request: steps.op_requests,
                    ops: steps.ops.len() as u32,
                    fingerprint: steps.fingerprint,
                    bytes: 0, // set when the request ends
                    victims: vec![victim],
                    out_of_memory: false,
                };
                steps.record.push(reservation);
            }
        }
    }

    /// Ends a request for `bytes` of memory (`failed`: out of memory).
    pub(super) fn step_request_done(&mut self, bytes: u64, failed: bool) {
        let Some(steps) = &mut self.steps else {
            return;
        };
        let open = steps
            .record
            .last()
            .is_some_and(|open| open.request == steps.requests);
        if failed && !open {
            steps.record.push(StepReservation {
                request: steps.requests,
                op_request: steps.op_requests,
                ops: steps.ops.len() as u32,
                fingerprint: steps.fingerprint,
                bytes,
                victims: Vec::new(),
                out_of_memory: true,
            });
        } else if let (true, Some(open)) = (open, steps.record.last_mut()) {
            open.bytes = bytes;
            open.out_of_memory = failed;
        }
        steps.requests += 1;
        steps.op_requests += 1;
    }
}
