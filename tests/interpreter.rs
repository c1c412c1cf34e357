//! Interpreter behaviour through the public API: eviction decisions,
//! multi-output ops, aliases, deletion, pins, out-of-memory recovery.

use std::sync::{Arc, Mutex};

use dtr::{
    BinaryOp, Config, CpuBackend, Error, Event, Interpreter, Observer, Op, ReduceOp, RunEvent,
    ScalarOp, Stats, TensorId, UnaryOp,
};

fn interpreter(config: Config) -> Interpreter<CpuBackend> {
    Interpreter::new(CpuBackend::new(), config.with_events(true)).unwrap()
}

/// `x + value`, costing 1 (the derivations below count ops, not traffic).
fn add_scalar(dtr: &mut Interpreter<CpuBackend>, x: TensorId, value: f32) -> TensorId {
    let op = Op::Scalar {
        op: ScalarOp::Add,
        value,
    };
    dtr.apply_op_with_cost(op, &[x], 1).unwrap()[0]
}

/// A one-element fill of `value`, costing 1.
fn fill1(dtr: &mut Interpreter<CpuBackend>, value: f32) -> TensorId {
    dtr.apply_op_with_cost(Op::fill(&[1], value), &[], 1)
        .unwrap()[0]
}

/// An eviction by the policy, at the score the derivation below gives.
fn evicted(tensor: TensorId, cost: f64, staleness: f64) -> Event {
    Event::Evict {
        tensor,
        bytes: 4,
        eager: false,
        score: Some(cost / (4.0 * staleness)),
    }
}

fn remat(tensor: TensorId, op: &'static str) -> Event {
    Event::Rematerialize {
        tensor,
        op: op.to_string(),
    }
}

/// OneFlow's chain: a 12-byte budget, 4-byte tensors (one f32 each, every op
/// costing 1), x1 = fill(1), x_k = x_{k-1} + 2, `del x1` after x2.
///
/// Derivation under h_DTR_eq (score = (c0 + Σ distinct evicted-neighbour
/// classes) / (bytes · (clock − last_access)); the clock starts at 1; the
/// pool is in the order storages became evictable; the last minimum wins):
/// - `del x1`: x1 has a dependent, so it is evicted eagerly (history kept).
/// - x5 (clock 5, pool [x2, x3]): x2 = (1 + x1's class 1) / (4·2) = 0.25,
///   x3 = 1 / (4·1) = 0.25 — a tie; the later candidate, x3, is evicted.
/// - x6 (clock 6, pool [x2, x4]): x2 = (1 + 1 + 1) / (4·3) = 0.25,
///   x4 = (1 + 1) / (4·1) = 0.5 — x2 is evicted; {x1, x2, x3} is one class.
/// - get_value(x3) at clock 7 needs x2, which needs x1:
///   room for x1 (pool [x4, x5, x6]): x4 = (1+3)/(4·2) = 0.5, x5 = 1/(4·1) = 0.25,
///   x6 has staleness 0 (+∞) — x5 goes; x1 is recomputed (class cost 3 → 2).
///   Room for x2 (clock 8, pool [x4, x6]): x4 = (1 + 2 + 1)/(4·3) = 0.33,
///   x6 = (1 + 1)/(4·1) = 0.5 — x4 goes; x2 is recomputed.
///   Room for x3 (clock 9, pool [x6, x1]): x6 = (1 + 3)/(4·2) = 0.5,
///   x1 = 1/(4·2) = 0.125 — x1 goes; x3 is recomputed.
#[test]
fn oneflow_chain_evicts_what_the_formula_says() {
    let mut dtr = interpreter(
        Config::default()
            .with_budget_bytes(12)
            .with_heuristic("dtr-eq"),
    );
    let x1 = fill1(&mut dtr, 1.0);
    let x2 = add_scalar(&mut dtr, x1, 2.0);
    dtr.del(x1).unwrap();
    let x3 = add_scalar(&mut dtr, x2, 2.0);
    let x4 = add_scalar(&mut dtr, x3, 2.0);
    let x5 = add_scalar(&mut dtr, x4, 2.0);
    let x6 = add_scalar(&mut dtr, x5, 2.0);
    let roots_x1 = Event::Evict {
        tensor: x1,
        bytes: 4,
        eager: true,
        score: None,
    };
    assert_eq!(
        dtr.events(),
        &[
            roots_x1.clone(),
            evicted(x3, 1.0, 1.0),
            evicted(x2, 3.0, 3.0)
        ]
    );

    assert_eq!(dtr.get_value(x6).unwrap(), vec![11.0]);
    assert_eq!(dtr.events().len(), 3, "x6 was resident");

    assert_eq!(dtr.get_value(x3).unwrap(), vec![5.0]);
    assert_eq!(
        &dtr.events()[3..],
        &[
            evicted(x5, 1.0, 1.0),
            remat(x1, "fill"),
            evicted(x4, 4.0, 3.0),
            remat(x2, "add_scalar"),
            evicted(x1, 1.0, 2.0),
            remat(x3, "add_scalar"),
        ]
    );
    assert_eq!(dtr.memory().peak_bytes, 12);
    assert_eq!(dtr.stats().rematerializations, 3);
    for t in [x2, x3, x4, x5, x6] {
        dtr.del(t).unwrap();
    }
    assert_eq!(dtr.tracked_tensors(), 0);
    assert_eq!(dtr.memory().in_use_bytes, 0);
}

/// Tallies what a user's observer sees, to compare with the interpreter's own.
#[derive(Default)]
struct Tally {
    stats: Stats,
    events: Vec<String>,
}

impl Observer for Tally {
    fn observe(&mut self, event: &RunEvent<'_>, graph: &dtr::graph::Graph) {
        self.stats.observe(event, graph);
        self.events.push(match event {
            RunEvent::Ran {
                node,
                rematerializing,
                ..
            } => format!("ran {} {rematerializing}", graph.nodes[*node].op().name()),
            RunEvent::Evicted { score, eager, .. } => format!("evict {score:?} {eager}"),
            RunEvent::OutOfMemory { .. } => "oom".to_string(),
            RunEvent::Apply { .. } => "apply".to_string(),
            _ => "other".to_string(),
        });
    }
}

/// A user's observer sees the same stream as the interpreter's counters:
/// counting it gives the same stats; an op runs before it is applied; an
/// out-of-memory error is told to it.
#[test]
fn a_users_observer_sees_every_event() {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut dtr = interpreter(
        Config::default()
            .with_budget_bytes(12)
            .with_heuristic("dtr-eq"),
    );
    dtr.set_observer(Box::new(tally.clone()));
    let x1 = fill1(&mut dtr, 1.0);
    let mut last = add_scalar(&mut dtr, x1, 2.0);
    dtr.del(x1).unwrap();
    for _ in 0..4 {
        last = add_scalar(&mut dtr, last, 2.0);
    }
    assert_eq!(dtr.get_value(last).unwrap(), vec![11.0]);
    let too_big = dtr.apply1(Op::fill(&[8], 1.0), &[]);
    assert!(matches!(too_big, Err(Error::OutOfMemory { .. })));
    dtr.finish_observer().unwrap();

    let tally = tally.lock().unwrap();
    assert_eq!(&tally.stats, dtr.stats());
    assert!(dtr.stats().evictions >= 3);
    assert_eq!(&tally.events[..2], ["ran fill false", "apply"]);
    assert_eq!(tally.events.last().map(String::as_str), Some("oom"));
    assert_eq!(
        tally
            .events
            .iter()
            .filter(|e| e.starts_with("evict Some"))
            .count() as u64,
        dtr.stats().evictions - dtr.stats().eager_evictions
    );
}

#[test]
fn multi_output_op_recomputes_only_missing_outputs() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[1.0, 2.0, 4.0, 3.0, 5.0, 9.0], &[2, 3]).unwrap();
    let gamma = dtr.put(&[1.0, 2.0, 0.5], &[3]).unwrap();
    let beta = dtr.put(&[0.0, 1.0, -1.0], &[3]).unwrap();
    let x2 = dtr.apply1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let outs = dtr
        .apply_op(Op::LayerNorm { eps: 1e-5 }, &[x2, gamma, beta])
        .unwrap();
    let (y, mean, rstd) = (outs[0], outs[1], outs[2]);
    let expected_y = dtr.get_value(y).unwrap();
    let expected_rstd = dtr.get_value(rstd).unwrap();
    // `mean` is dropped for good (no one reads it); then only y may be evicted.
    dtr.del(mean).unwrap();
    dtr.pin(x2).unwrap();
    dtr.pin(rstd).unwrap();
    dtr.set_budget_bytes(Some(dtr.memory().in_use_bytes));
    let filler = dtr.apply1(Op::fill(&[6], 0.0), &[]).unwrap();
    dtr.del(filler).unwrap();
    assert!(!dtr.is_resident(y).unwrap() && dtr.is_resident(rstd).unwrap());
    dtr.set_budget_bytes(None);
    let (in_use, before) = (dtr.memory().in_use_bytes, dtr.stats().rematerializations);
    // One run of layer_norm restores y; the fresh mean and rstd are dropped.
    assert_eq!(dtr.get_value(y).unwrap(), expected_y);
    assert_eq!(dtr.stats().rematerializations, before + 1);
    assert_eq!(dtr.memory().in_use_bytes, in_use + 24);
    assert_eq!(
        dtr.memory().peak_bytes.max(in_use + 24 + 8 + 8),
        dtr.memory().peak_bytes
    );
    assert_eq!(dtr.get_value(rstd).unwrap(), expected_rstd);
    dtr.check_invariants().unwrap();
}

#[test]
fn views_share_storage_and_are_replayed_after_eviction() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
    let y = dtr
        .apply1(
            Op::Scalar {
                op: ScalarOp::Mul,
                value: 10.0,
            },
            &[x],
        )
        .unwrap();
    let in_use = dtr.memory().in_use_bytes;
    let v = dtr
        .apply1(Op::Transpose { dim0: 0, dim1: 1 }, &[y])
        .unwrap();
    let s = dtr
        .apply1(
            Op::Slice {
                axis: 0,
                start: 1,
                end: 3,
            },
            &[v],
        )
        .unwrap();
    assert_eq!(dtr.memory().in_use_bytes, in_use, "views allocate nothing");
    assert_eq!(dtr.get_value(s).unwrap(), vec![10.0, 40.0, 20.0, 50.0]);

    // Dropping y keeps its storage: the views still hold it.
    dtr.del(y).unwrap();
    assert!(dtr.is_resident(v).unwrap());
    // Pressure evicts the shared storage; both views become undefined.
    dtr.set_budget_bytes(Some(in_use));
    let _z = dtr.apply1(Op::fill(&[6], 0.0), &[]).unwrap();
    assert!(!dtr.is_resident(v).unwrap() && !dtr.is_resident(s).unwrap());
    dtr.set_budget_bytes(None);
    assert_eq!(dtr.get_value(s).unwrap(), vec![10.0, 40.0, 20.0, 50.0]);
    assert_eq!(
        dtr.get_value(v).unwrap(),
        vec![0.0, 30.0, 10.0, 40.0, 20.0, 50.0]
    );
    dtr.check_invariants().unwrap();
}

#[test]
fn deleting_a_tensor_with_evicted_dependents_keeps_its_history() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[0.5, 1.5], &[2]).unwrap();
    let a = dtr.apply1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let b = dtr.apply1(Op::Unary(UnaryOp::Tanh), &[a]).unwrap();
    let c = dtr.apply1(Op::Unary(UnaryOp::Sigmoid), &[b]).unwrap();
    let expected = dtr.get_value(c).unwrap();
    dtr.del(b).unwrap(); // evicted eagerly: c still depends on it
    dtr.del(a).unwrap(); // same
    assert_eq!(dtr.stats().eager_evictions, 2);
    assert_eq!(dtr.tracked_tensors(), 4, "a and b stay as history");
    // Push c out too, then ask for it: the whole chain is recomputed.
    dtr.set_budget_bytes(Some(dtr.memory().in_use_bytes));
    let filler = dtr.apply1(Op::fill(&[2], 0.0), &[]).unwrap();
    dtr.del(filler).unwrap();
    assert!(!dtr.is_resident(c).unwrap());
    dtr.set_budget_bytes(None);
    assert_eq!(dtr.get_value(c).unwrap(), expected);
    // Dropping the last handles frees everything, history included.
    dtr.del(c).unwrap();
    dtr.del(x).unwrap();
    assert_eq!((dtr.tracked_tensors(), dtr.tracked_storages()), (0, 0));
    assert_eq!(dtr.memory().in_use_bytes, 0);
}

#[test]
fn pinned_and_put_tensors_are_never_evicted() {
    let mut dtr = interpreter(
        Config::default()
            .with_budget_bytes(16)
            .with_heuristic("lru"),
    );
    let x = dtr.put(&[1.0], &[1]).unwrap();
    let a = dtr.apply1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    dtr.pin(a).unwrap();
    let mut last = a;
    for _ in 0..20 {
        last = add_scalar(&mut dtr, last, 1.0);
        assert!(dtr.is_resident(a).unwrap() && dtr.is_resident(x).unwrap());
        assert!(dtr.memory().in_use_bytes <= 16);
    }
    assert!(dtr.stats().evictions > 0);
    // x and a hold 8 of the 16 bytes for good: 8 more fit, 12 cannot.
    let fits = dtr.apply1(Op::fill(&[2], 0.0), &[]);
    assert!(
        fits.is_ok(),
        "an 8-byte fill fits once the chain is evicted"
    );
    let err = dtr.apply1(Op::fill(&[3], 0.0), &[]).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    dtr.unpin(a).unwrap();
    assert!(dtr.unpin(a).is_err(), "unpin twice is an error");
    dtr.check_invariants().unwrap();
}

#[test]
fn out_of_memory_leaves_state_consistent_and_recovers() {
    let mut dtr = interpreter(Config::default().with_budget_bytes(32));
    let x = dtr.put(&[1.0, 2.0, 3.0, 4.0], &[4]).unwrap();
    let y = dtr.apply1(Op::Unary(UnaryOp::Sqrt), &[x]).unwrap();
    let tensors_before = dtr.tracked_tensors();
    let too_big = dtr.apply1(Op::fill(&[16], 1.0), &[]).unwrap_err();
    match &too_big {
        Error::OutOfMemory {
            requested_bytes,
            budget_bytes,
            ..
        } => {
            assert_eq!((*requested_bytes, *budget_bytes), (64, 32));
        }
        other => panic!("expected out of memory, got {other}"),
    }
    assert!(
        too_big.to_string().contains("op `fill` needs 64 B"),
        "{too_big}"
    );
    dtr.check_invariants().unwrap();
    assert_eq!(
        dtr.tracked_tensors(),
        tensors_before,
        "the failed op left nothing behind"
    );
    assert_eq!(
        dtr.get_value(y).unwrap(),
        vec![1.0, 2f32.sqrt(), 3f32.sqrt(), 2.0]
    );
    // A buffer adopted from outside has no shape dtr knows: the error says
    // what it is.
    let adopted = dtr.adopt(64, vec![0.0; 16]).unwrap_err();
    assert!(
        adopted
            .to_string()
            .contains("buffer adopted from outside dtr needs 64 B"),
        "{adopted}"
    );
    dtr.check_invariants().unwrap();
    dtr.set_budget_bytes(Some(1024));
    let big = dtr.apply1(Op::fill(&[16], 1.0), &[]).unwrap();
    assert_eq!(dtr.get_value(big).unwrap(), vec![1.0; 16]);
}

#[test]
fn out_of_memory_during_rematerialisation_releases_locks() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[1.0; 4], &[4]).unwrap();
    let a = dtr.apply1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let b = dtr.apply1(Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    let expected = dtr.get_value(b).unwrap();
    dtr.del(a).unwrap();
    // Force b out, then leave no room to recompute a and b together.
    dtr.set_budget_bytes(Some(32));
    let pin = dtr.apply1(Op::fill(&[4], 0.0), &[]).unwrap();
    dtr.pin(pin).unwrap();
    assert!(!dtr.is_resident(b).unwrap());
    let err = dtr.get_value(b).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("op `exp`, rerun to rematerialise an evicted tensor, needs 16 B"),
        "the error says the op is a rematerialisation: {err}"
    );
    dtr.check_invariants().unwrap();
    // x and the pinned fill hold 32 B; a (locked) and b need 16 B each.
    dtr.set_budget_bytes(Some(64));
    assert_eq!(dtr.get_value(b).unwrap(), expected);
    dtr.check_invariants().unwrap();
}

/// A backward-like chain: a_k = a_{k-1} + 1 (all held), g_n = 2·a_n and
/// g_k = g_{k+1} + a_k, with only g_1 held. Recomputing g_1 opens a frame per
/// level, each locking its resident a_k, so with x and all six a's resident a
/// 7-tensor budget leaves no room for g_6 unless those locks give way.
fn backward_chain(dtr: &mut Interpreter<CpuBackend>) -> (TensorId, Vec<TensorId>) {
    let x = dtr.put(&[1.0], &[1]).unwrap();
    let mut a = vec![x];
    for _ in 0..6 {
        let next = add_scalar(dtr, *a.last().unwrap(), 1.0);
        a.push(next);
    }
    let mut g = dtr
        .apply1(
            Op::Scalar {
                op: ScalarOp::Mul,
                value: 2.0,
            },
            &[a[6]],
        )
        .unwrap();
    for k in (1..6).rev() {
        let next = dtr.apply1(Op::Binary(BinaryOp::Add), &[g, a[k]]).unwrap();
        dtr.del(g).unwrap();
        g = next;
    }
    (g, a)
}

#[test]
fn pending_rematerialisations_surrender_their_locks_rather_than_fail() {
    // g_1 = 2·a_6 + a_5 + … + a_1 with a_k = 1 + k.
    let expected = vec![2.0 * 7.0 + (2..=6).map(|v| v as f32).sum::<f32>()];
    for relax in [true, false] {
        let mut dtr = interpreter(Config::default().with_lock_relaxation(relax));
        let (g1, a) = backward_chain(&mut dtr);
        assert_eq!(dtr.get_value(g1).unwrap(), expected);
        assert!(dtr.evict_now(g1).unwrap());
        dtr.set_budget_bytes(Some(7 * 4));
        let result = dtr.get_value(g1);
        dtr.check_invariants().unwrap();
        if relax {
            assert_eq!(result.unwrap(), expected);
            assert!(dtr.stats().lock_relaxations > 0);
            assert!(dtr.memory().in_use_bytes <= 7 * 4);
        } else {
            let err = result.unwrap_err();
            assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
            assert_eq!(dtr.stats().lock_relaxations, 0);
            // Nothing was lost: more room and it completes.
            dtr.set_budget_bytes(Some(9 * 4));
            assert_eq!(dtr.get_value(g1).unwrap(), expected);
        }
        for &a_k in &a[1..] {
            assert_eq!(
                dtr.get_value(a_k).unwrap().len(),
                1,
                "every held activation is still readable"
            );
        }
        dtr.check_invariants().unwrap();
    }
}

#[test]
fn bad_requests_are_errors() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[1.0, 2.0], &[2]).unwrap();
    let y = dtr.put(&[1.0, 2.0, 3.0], &[3]).unwrap();
    let err = dtr.apply1(Op::Binary(BinaryOp::Add), &[x, y]).unwrap_err();
    assert_eq!(err.to_string(), "add: shapes [2] and [3] do not broadcast");
    assert!(dtr.put(&[1.0], &[2]).is_err());
    dtr.del(x).unwrap();
    assert!(matches!(dtr.get_value(x), Err(Error::UnknownTensor(_))));
    assert!(matches!(dtr.del(x), Err(Error::UnknownTensor(_))));
    assert!(matches!(
        dtr.apply1(Op::Unary(UnaryOp::Neg), &[x]),
        Err(Error::UnknownTensor(_))
    ));
    let idx = dtr.put(&[5.0], &[1]).unwrap();
    let table = dtr.put(&[0.0; 4], &[2, 2]).unwrap();
    let err = dtr.apply1(Op::Embedding, &[table, idx]).unwrap_err();
    assert!(
        err.to_string()
            .contains("embedding index 5 is not an integer in 0..2"),
        "{err}"
    );
    dtr.check_invariants().unwrap();
    assert!(Interpreter::new(CpuBackend::new(), Config::default().with_heuristic("nope")).is_err());
}

#[test]
fn a_million_long_evicted_chain_regenerates_without_recursion() {
    const LENGTH: usize = 1_000_000;
    let mut dtr = Interpreter::new(
        CpuBackend::new(),
        Config::default().with_heuristic("dtr-local"),
    )
    .unwrap();
    let mut last = dtr.apply1(Op::fill(&[1], 0.0), &[]).unwrap();
    for _ in 0..LENGTH {
        let next = add_scalar(&mut dtr, last, 1.0);
        dtr.del(last).unwrap(); // eager eviction keeps only the newest resident
        last = next;
    }
    assert_eq!(dtr.memory().in_use_bytes, 4);
    // Push the last one out as well, then read it: the whole chain replays.
    dtr.set_budget_bytes(Some(8));
    let filler = dtr.apply1(Op::fill(&[2], 0.0), &[]).unwrap();
    dtr.del(filler).unwrap();
    assert!(!dtr.is_resident(last).unwrap());
    assert_eq!(dtr.get_value(last).unwrap(), vec![LENGTH as f32]);
    assert_eq!(dtr.stats().rematerializations, LENGTH as u64 + 1);
    assert!(dtr.memory().peak_bytes <= 12);
}

#[test]
fn detach_cuts_history_so_training_loops_do_not_grow() {
    let mut dtr = interpreter(Config::default().with_budget_bytes(256));
    let mut w = dtr.put(&[1.0, 2.0, 3.0, 4.0], &[4]).unwrap();
    let mut tracked = None;
    for _ in 0..50 {
        let g = dtr.apply1(Op::Unary(UnaryOp::Tanh), &[w]).unwrap();
        let step = dtr
            .apply1(
                Op::Scalar {
                    op: ScalarOp::Mul,
                    value: 0.1,
                },
                &[g],
            )
            .unwrap();
        let next = dtr.apply1(Op::Binary(BinaryOp::Sub), &[w, step]).unwrap();
        dtr.detach(next).unwrap();
        for t in [g, step, w] {
            dtr.del(t).unwrap();
        }
        w = next;
        // After the first step the tables hold exactly one tensor: the parameter.
        assert_eq!(
            *tracked.get_or_insert(dtr.tracked_tensors()),
            dtr.tracked_tensors()
        );
        dtr.check_invariants().unwrap();
    }
    assert_eq!(dtr.tracked_tensors(), 1);
    assert_eq!(dtr.memory().in_use_bytes, 16);
    let v = dtr
        .apply1(Op::Transpose { dim0: 0, dim1: 0 }, &[w])
        .unwrap();
    assert!(matches!(dtr.detach(v), Err(Error::InvalidArgument(_))));
}

#[test]
fn thrashing_is_an_error_that_leaves_state_consistent() {
    let mut dtr = interpreter(Config::default().with_remat_limit(3));
    let mut last = dtr.apply1(Op::fill(&[1], 0.0), &[]).unwrap();
    for _ in 0..8 {
        let next = add_scalar(&mut dtr, last, 1.0);
        dtr.del(last).unwrap(); // evicted eagerly, history kept
        last = next;
    }
    dtr.set_budget_bytes(Some(8));
    let filler = dtr.apply1(Op::fill(&[2], 0.0), &[]).unwrap();
    dtr.del(filler).unwrap();
    // Recomputing the chain costs 9 > 3.
    let err = dtr.get_value(last).unwrap_err();
    assert!(matches!(err, Error::Thrash { limit: 3, .. }), "{err}");
    dtr.check_invariants().unwrap();
    // The user's next op, needing no recomputation, still runs.
    let x = dtr.put(&[2.0], &[1]).unwrap();
    let y = dtr.apply1(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    assert_eq!(dtr.get_value(y).unwrap(), vec![-2.0]);
    dtr.check_invariants().unwrap();
}

/// Before a constant changes in place, its live dependents are recomputed
/// from the old value and detached; history that only they needed goes.
#[test]
fn preserving_dependents_materialises_and_detaches_them() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[1.0, 2.0], &[2]).unwrap();
    let hidden = add_scalar(&mut dtr, x, 1.0);
    let y = add_scalar(&mut dtr, hidden, 10.0);
    dtr.del(hidden).unwrap(); // history of y only
    assert!(dtr.evict_now(y).unwrap());
    assert!(!dtr.is_resident(y).unwrap());
    let detached = dtr.preserve_dependents(x).unwrap();
    assert_eq!(detached, vec![y]);
    assert!(dtr.is_resident(y).unwrap());
    assert!(
        !dtr.evict_now(y).unwrap(),
        "a detached tensor is a constant"
    );
    assert_eq!(dtr.get_value(y).unwrap(), vec![12.0, 13.0]);
    // Nothing reads x any more: a second call finds no dependents.
    assert!(dtr.preserve_dependents(x).unwrap().is_empty());
    dtr.check_invariants().unwrap();
}

/// Only the nearest dependents become constants: one computed from a
/// detached dependent recomputes from it, a constant holding the old value
/// it read, so it stays evictable, and its value is the one it had. One
/// smaller than the constant it would keep alive is detached as well.
#[test]
fn preserving_dependents_stops_at_the_nearest_held_ones() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[1.0, 2.0], &[2]).unwrap();
    let hidden = add_scalar(&mut dtr, x, 1.0);
    let near = add_scalar(&mut dtr, hidden, 10.0);
    dtr.del(hidden).unwrap();
    let far = add_scalar(&mut dtr, near, 100.0);
    let sum = Op::Reduce {
        op: ReduceOp::Sum,
        axis: 0,
        keepdim: false,
    };
    let total = dtr.apply_op_with_cost(sum, &[far], 1).unwrap()[0];
    let beside = add_scalar(&mut dtr, x, -1.0);
    let mut detached = dtr.preserve_dependents(x).unwrap();
    detached.sort();
    let mut cut = vec![near, beside, total];
    cut.sort();
    assert_eq!(detached, cut);
    assert_eq!(dtr.get_value(total).unwrap(), vec![225.0]);
    assert!(
        !dtr.evict_now(near).unwrap(),
        "a detached tensor is a constant"
    );
    // No history reads `x` any more: released, it is freed at once, and
    // `far` recomputes from `near`.
    let before = dtr.memory().in_use_bytes;
    dtr.del(x).unwrap();
    assert_eq!(dtr.memory().in_use_bytes, before - 8);
    assert!(dtr.evict_now(far).unwrap(), "still computed, so evictable");
    assert_eq!(dtr.get_value(far).unwrap(), vec![112.0, 113.0]);
    dtr.check_invariants().unwrap();
}

/// The other way to keep history whole before a constant changes: its
/// readers read a copy. Recomputation then reads the copy (here a put of
/// other values, to show it), nothing is detached, and the old constant
/// is free to go.
#[test]
fn redirected_reads_recompute_from_the_copy() {
    let mut dtr = interpreter(Config::default());
    let x = dtr.put(&[1.0, 2.0], &[2]).unwrap();
    let y = add_scalar(&mut dtr, x, 1.0);
    let z = add_scalar(&mut dtr, y, 1.0);
    assert_eq!(dtr.bytes_preserving_dependents(x).unwrap(), 8, "y, held");
    let copy = dtr.put(&[10.0, 20.0], &[2]).unwrap();
    let other = dtr.put(&[0.0; 3], &[3]).unwrap();
    assert!(dtr.redirect_reads(x, other).is_err(), "another layout");
    assert!(dtr.redirect_reads(x, z).is_err(), "not a constant");
    dtr.redirect_reads(x, copy).unwrap();
    assert_eq!(dtr.bytes_preserving_dependents(x).unwrap(), 0);
    assert!(dtr.preserve_dependents(x).unwrap().is_empty());
    dtr.del(copy).unwrap(); // history keeps it
    let before = dtr.memory().in_use_bytes;
    dtr.del(x).unwrap();
    assert_eq!(dtr.memory().in_use_bytes, before - 8, "no history reads x");
    assert!(dtr.evict_now(y).unwrap());
    assert!(dtr.evict_now(z).unwrap());
    assert_eq!(dtr.get_value(z).unwrap(), vec![12.0, 22.0]);
    dtr.check_invariants().unwrap();
}

/// A constant the program let go of, that only the history of a small held
/// tensor reads: out of memory, it is freed by detaching that tensor.
#[test]
fn out_of_memory_frees_a_constant_only_history_holds_by_detaching() {
    let run = |free: bool| {
        let config = Config::default()
            .with_budget_bytes(6 * 4 + 4)
            .with_constants_freed_by_detaching(free);
        let mut dtr = interpreter(config);
        let x = dtr.put(&[1.0, 2.0, 3.0], &[3]).unwrap();
        let doubled = add_scalar(&mut dtr, x, 1.0);
        let sum = Op::Reduce {
            op: ReduceOp::Sum,
            axis: 0,
            keepdim: false,
        };
        let total = dtr.apply_op_with_cost(sum, &[doubled], 1).unwrap()[0];
        dtr.del(doubled).unwrap();
        dtr.del(x).unwrap(); // kept: `total`'s history reads it
        let y = dtr.put(&[0.0; 6], &[6]);
        (dtr, total, y)
    };
    let (dtr, _, y) = run(false);
    assert!(matches!(y, Err(Error::OutOfMemory { .. })), "{y:?}");
    dtr.check_invariants().unwrap();

    let (mut dtr, total, y) = run(true);
    assert!(y.is_ok(), "{y:?}");
    assert!(!dtr.evict_now(total).unwrap(), "detached: a constant");
    assert_eq!(dtr.get_value(total).unwrap(), vec![9.0]);
    assert!(dtr.memory().peak_bytes <= 6 * 4 + 4);
    dtr.check_invariants().unwrap();
}

/// One step of a chain of `length` ops on `x`, reading back the last one:
/// the evictions under a tight budget follow from its shape alone.
fn chain_step(dtr: &mut Interpreter<CpuBackend>, x: TensorId, length: usize) -> Vec<f32> {
    let mut tensors = vec![x];
    for k in 0..length {
        let last = *tensors.last().unwrap();
        tensors.push(add_scalar(dtr, last, k as f32));
    }
    let value = dtr.get_value(*tensors.last().unwrap()).unwrap();
    for &t in &tensors[1..] {
        dtr.del(t).unwrap();
    }
    value
}

#[test]
fn marked_steps_follow_the_last_step_until_the_program_or_the_budget_changes() {
    let mut dtr = interpreter(Config::default().with_budget_bytes(5 * 4));
    let x = dtr.put(&[1.0], &[1]).unwrap();
    let mut followed = Vec::new();
    for length in [8, 8, 8, 9, 9, 9] {
        let before = dtr.stats().planned_steps;
        assert_eq!(
            chain_step(&mut dtr, x, length),
            vec![1.0 + (0..length).sum::<usize>() as f32]
        );
        dtr.mark_step().unwrap();
        followed.push(dtr.stats().planned_steps > before);
    }
    // The first step runs before any mark; the second is recorded; a longer
    // chain departs from its plan and is learnt in turn.
    assert_eq!(followed, [false, false, true, false, true, true]);
    // Planned evictions have no score: no policy chose them.
    let scores: Vec<bool> = dtr
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Evict { score, .. } => Some(score.is_some()),
            _ => None,
        })
        .collect();
    assert!(scores.iter().any(|&scored| scored) && scores.iter().any(|&scored| !scored));

    // A new budget drops the plan: the next step runs the policy again.
    dtr.set_budget_bytes(Some(6 * 4));
    for expected in [false, false, true] {
        let before = dtr.stats().planned_steps;
        chain_step(&mut dtr, x, 9);
        dtr.mark_step().unwrap();
        assert_eq!(dtr.stats().planned_steps > before, expected);
    }
    assert_eq!(dtr.stats().steps, 9);
    dtr.check_invariants().unwrap();
}

/// A chain step as [`chain_step`] that frees `earlier` (tensors of the
/// step before) after its op `free_earlier_after`, and returns its last
/// tensor instead of freeing it.
fn chain_step_freeing(
    dtr: &mut Interpreter<CpuBackend>,
    x: TensorId,
    earlier: &[TensorId],
    free_earlier_after: usize,
) -> (Vec<f32>, TensorId) {
    let mut tensors = vec![x];
    for k in 0..8 {
        let last = *tensors.last().unwrap();
        tensors.push(add_scalar(dtr, last, k as f32));
        if k == free_earlier_after {
            for &t in earlier {
                dtr.del(t).unwrap();
            }
        }
    }
    let last = tensors.pop().unwrap();
    let value = dtr.get_value(last).unwrap();
    for &t in &tensors[1..] {
        dtr.del(t).unwrap();
    }
    (value, last)
}

#[test]
fn a_step_whose_memory_differs_from_its_plans_is_repaired_and_keeps_following() {
    let mut dtr = interpreter(Config::default().with_budget_bytes(5 * 4));
    let x = dtr.put(&[1.0], &[1]).unwrap();
    let expected = vec![1.0 + (0..8).sum::<usize>() as f32];
    let mut kept = None;
    let mut followed = Vec::new();
    // Each step leaves its result to the next, which frees it after its
    // op `free_after`: the same ops every step, but a step that frees it
    // later than the last one finds less room where the plan made room.
    for free_after in [0, 0, 0, 5, 5, 0, 0] {
        let before = dtr.stats().clone();
        let earlier: Vec<TensorId> = kept.take().into_iter().collect();
        let (value, last) = chain_step_freeing(&mut dtr, x, &earlier, free_after);
        assert_eq!(value, expected);
        kept = Some(last);
        dtr.mark_step().unwrap();
        let after = dtr.stats();
        followed.push((
            after.planned_steps > before.planned_steps,
            after.plan_repairs - before.plan_repairs,
        ));
    }
    // The fourth step (the first to free late) and the sixth (the first to
    // free early again) find other room than their plans made: the first
    // falls short and is repaired, the second has more than it needs.
    // Every step from the third on follows its plan.
    assert_eq!(followed[..2], [(false, 0), (false, 0)]);
    assert!(
        followed[2..].iter().all(|&(planned, _)| planned),
        "{followed:?}"
    );
    assert!(followed[3].1 > 0, "{followed:?}");
    assert!(dtr.memory().peak_bytes <= 5 * 4);
    dtr.check_invariants().unwrap();
}

#[test]
fn marking_steps_while_a_static_plan_is_recorded_is_an_error() {
    let mut dtr = interpreter(Config::default().with_budget_bytes(64));
    dtr.record_plan().unwrap();
    let error = dtr.mark_step().unwrap_err();
    assert!(
        matches!(error, Error::InvalidArgument(ref m) if m.contains("static plan")),
        "{error}"
    );
}

/// With [`Config::keep_needed_history`], releasing a tensor that an evicted,
/// still-held tensor needs keeps it resident, so recomputing the held one
/// stops there instead of running the whole released history again.
#[test]
fn released_history_that_an_evicted_live_tensor_needs_stays_resident() {
    let run = |keep: bool| {
        let mut dtr = interpreter(Config::default().with_kept_needed_history(keep));
        let x = dtr.put(&[0.5, 1.5], &[2]).unwrap();
        let a = dtr.apply1(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        let b = dtr.apply1(Op::Unary(UnaryOp::Tanh), &[a]).unwrap();
        let c = dtr.apply1(Op::Unary(UnaryOp::Sigmoid), &[b]).unwrap();
        let expected = dtr.get_value(c).unwrap();
        assert!(dtr.evict_now(c).unwrap());
        dtr.del(b).unwrap(); // c is evicted and held: b is what recomputing it reads
        dtr.del(a).unwrap(); // b is resident: nothing evicted needs a
        let graph = dtr.graph();
        let kept = graph.storages[graph.tensors[b].storage].is_resident();
        assert_eq!(dtr.get_value(c).unwrap(), expected);
        dtr.check_invariants().unwrap();
        (
            kept,
            dtr.stats().eager_evictions,
            dtr.stats().rematerializations,
        )
    };
    // The authors' convention: both evicted at once; c needs a, b and c again.
    assert_eq!(run(false), (false, 2, 3));
    // b stays (an ordinary candidate); only a goes; c alone is recomputed.
    assert_eq!(run(true), (true, 1, 1));
}

/// A recurrent step: a chain of `length` states, then a backward pass
/// that reads them in reverse, each gradient from the one after it.
fn recurrent_step(dtr: &mut Interpreter<CpuBackend>, x: TensorId, length: usize) -> Vec<f32> {
    let mut states = vec![x];
    for k in 0..length {
        let last = *states.last().unwrap();
        states.push(add_scalar(dtr, last, k as f32));
    }
    let mut grad = add_scalar(dtr, *states.last().unwrap(), 0.5);
    for k in (1..length).rev() {
        let sum = dtr
            .apply_op_with_cost(Op::Binary(BinaryOp::Add), &[grad, states[k]], 1)
            .unwrap()[0];
        dtr.del(grad).unwrap();
        dtr.del(states[k]).unwrap();
        grad = sum;
    }
    dtr.del(states[length]).unwrap();
    let value = dtr.get_value(grad).unwrap();
    dtr.del(grad).unwrap();
    value
}

#[test]
fn marked_steps_let_dtr_next_look_ahead_from_the_last_step() {
    let length = 24;
    let mut unbounded = interpreter(Config::default());
    let x = unbounded.put(&[1.0], &[1]).unwrap();
    let expected = recurrent_step(&mut unbounded, x, length);
    // Per step: the recomputation, and whether it followed its plan.
    let run = |heuristic: &str| {
        let mut dtr = interpreter(
            Config::default()
                .with_heuristic(heuristic)
                .with_budget_bytes(8 * 4),
        );
        let x = dtr.put(&[1.0], &[1]).unwrap();
        let mut steps = Vec::new();
        for _ in 0..5 {
            let before = dtr.stats().clone();
            assert_eq!(recurrent_step(&mut dtr, x, length), expected);
            dtr.mark_step().unwrap();
            let after = dtr.stats();
            steps.push((
                after.remat_compute - before.remat_compute,
                after.planned_steps > before.planned_steps,
            ));
            assert!(dtr.memory().peak_bytes <= 8 * 4);
        }
        dtr.check_invariants().unwrap();
        steps
    };
    let dtr = run("dtr");
    let next = run("dtr-next");
    // With no foresight yet (the first step, and the second, recorded)
    // `dtr-next` is `dtr`.
    assert_eq!(next[..2], dtr[..2]);
    // The third step looks ahead from the second: no plan is followed,
    // one made without foresight being no better than `dtr`'s; the
    // fourth follows the third's.
    assert!(!next[2].1 && next[3].1 && next[4].1, "{next:?}");
    assert!(next[2].0 < dtr[2].0, "dtr-next {next:?}, dtr {dtr:?}");
    assert_eq!(next[3].0, next[2].0);
}

/// `dtr-next` keeps when the program next reads a candidate's evicted
/// region from one search to the next, but not once the program says an
/// evicted tensor is read at another time: the candidate is priced anew.
#[test]
fn a_new_next_read_of_an_evicted_tensor_reprices_what_it_needs() {
    // Room for the put, `a` and ten others: enough candidates that one
    // eviction is settled by a walk rather than by forgetting every cache.
    let mut dtr = interpreter(
        Config::default()
            .with_heuristic("dtr-next")
            .with_budget_bytes(12 * 16),
    );
    let x = dtr.put(&[1.0; 4], &[4]).unwrap();
    let a = add_scalar(&mut dtr, x, 1.0);
    let b = add_scalar(&mut dtr, a, 1.0);
    dtr.evict_now(b).unwrap();
    let others: Vec<TensorId> = (0..10).map(|k| add_scalar(&mut dtr, x, k as f32)).collect();
    dtr.set_program_time(0);
    for (tensor, at) in [(x, 5), (a, 1000), (b, 10)] {
        dtr.set_next_read(tensor, Some(at));
    }
    for &other in &others {
        dtr.set_next_read(other, Some(100));
    }
    let resident = |dtr: &Interpreter<CpuBackend>, t: TensorId| {
        dtr.graph().storages[dtr.graph().tensors[t].storage].is_resident()
    };
    let others_resident =
        |dtr: &Interpreter<CpuBackend>| others.iter().filter(|&&t| resident(dtr, t)).count();
    // `a` is needed soon, through `b`: one of the others goes.
    let e = add_scalar(&mut dtr, x, 20.0);
    dtr.set_next_read(e, Some(50));
    assert!(resident(&dtr, a));
    assert_eq!(others_resident(&dtr), 9);
    // Now `b` is read much later, and `a` itself late: `a` goes.
    dtr.set_next_read(b, Some(100_000));
    add_scalar(&mut dtr, x, 21.0);
    assert!(!resident(&dtr, a));
    assert_eq!(others_resident(&dtr), 9);
}

/// `dtr-next` with room for everything (no eviction blurs the foresight),
/// and a put to compute from.
fn looking_ahead_with_room() -> (Interpreter<CpuBackend>, TensorId) {
    let mut dtr = interpreter(
        Config::default()
            .with_heuristic("dtr-next")
            .with_budget_bytes(1 << 20),
    );
    let x = dtr.put(&[1.0; 4], &[4]).unwrap();
    (dtr, x)
}

/// Reads outside ops count in the foresight a step gives the next: a loss
/// the host reads (or that a detach needs, before a parameter it was
/// computed from changes in place) is not taken for a tensor never read
/// again, which `dtr-next` would evict first.
#[test]
fn host_reads_count_in_the_last_steps_foresight() {
    let (mut dtr, x) = looking_ahead_with_room();
    let mut foreseen = Vec::new();
    for _ in 0..4 {
        let a = add_scalar(&mut dtr, x, 1.0);
        let loss = add_scalar(&mut dtr, a, 1.0); // read by no op
        dtr.del(a).unwrap();
        let storage = dtr.graph().tensors[loss].storage;
        foreseen.push(dtr.graph().until_next_read(storage));
        let b = add_scalar(&mut dtr, x, 2.0);
        assert_eq!(dtr.get_value(loss).unwrap(), vec![3.0; 4]);
        dtr.del(loss).unwrap();
        dtr.del(b).unwrap();
        dtr.mark_step().unwrap();
    }
    // No foresight in the first two steps (the second is recorded); from
    // the third, the read by the host one op later.
    assert_eq!(foreseen[..2], [None, None]);
    assert!(
        foreseen[2].is_some() && foreseen[3] == foreseen[2],
        "{foreseen:?}"
    );
}

/// A pin is not a read in a step's foresight: a framework pins an op's
/// inputs while one of them is restored (`dtr.torch` does), so pins fall
/// wherever evictions did, and counting them would shift every later read
/// of the tensor in the next step.
#[test]
fn pins_leave_the_next_steps_foresight_as_it_was() {
    let (mut dtr, x) = looking_ahead_with_room();
    let mut foreseen = Vec::new();
    for step in 0..5 {
        let a = add_scalar(&mut dtr, x, 1.0);
        if step == 2 {
            dtr.pin(a).unwrap();
            dtr.unpin(a).unwrap();
        }
        let b = add_scalar(&mut dtr, a, 1.0);
        // `a` is read next by the op that makes `c`.
        foreseen.push(dtr.graph().until_next_read(dtr.graph().tensors[a].storage));
        let c = dtr
            .apply_op_with_cost(Op::Binary(BinaryOp::Add), &[a, b], 1)
            .unwrap()[0];
        assert_eq!(dtr.get_value(c).unwrap(), vec![5.0; 4]);
        for t in [a, b, c] {
            dtr.del(t).unwrap();
        }
        dtr.mark_step().unwrap();
    }
    assert!(foreseen[2].is_some(), "{foreseen:?}");
    assert_eq!(foreseen[3], foreseen[2], "the pinned step's foresight");
    assert_eq!(foreseen[4], foreseen[2]);
}

/// Storages under `min_evictable_bytes` are never the policy's victims:
/// under LRU the stalest, a tiny one, goes first without the floor and
/// stays with it. Asked for, it is evicted either way.
#[test]
fn storages_under_the_floor_are_never_the_policys_victims() {
    for floor in [0, 1024] {
        let config = Config::default()
            .with_heuristic("lru")
            .with_budget_bytes(3 * 4096 + 16)
            .with_min_evictable_bytes(floor);
        let mut dtr = interpreter(config);
        let x = dtr.put(&[1.0; 1024], &[1024]).unwrap();
        let tiny = fill1(&mut dtr, 2.0); // 4 bytes, the stalest
        let small = add_scalar(&mut dtr, x, 1.0); // 4096 bytes each
        let a = add_scalar(&mut dtr, small, 1.0);
        // A fourth 4096-byte tensor fits only once `small` goes.
        let b = add_scalar(&mut dtr, a, 1.0);
        assert_eq!(dtr.is_resident(tiny).unwrap(), floor > 0, "floor {floor}");
        assert!(!dtr.is_resident(small).unwrap());
        assert_eq!(dtr.get_value(b).unwrap(), vec![4.0; 1024]);
        assert_eq!(dtr.get_value(tiny).unwrap(), vec![2.0]);
        assert!(dtr.evict_now(tiny).unwrap());
        dtr.check_invariants().unwrap();
    }
}

/// Under a budget, recomputation that costs more than `remat_ratio_limit`
/// times the first runs so far stops with `Thrash`, leaving all consistent;
/// unbounded, nothing is recomputed and nothing is checked.
#[test]
fn recomputation_past_the_ratio_limit_is_a_thrash_error() {
    let run = |ratio: f64| {
        let config = Config::default()
            .with_budget_bytes(3 * 4096)
            .with_remat_ratio_limit(ratio);
        let mut dtr = interpreter(config);
        let x = dtr.put(&[1.0; 1024], &[1024]).unwrap();
        let mut chain = vec![x];
        for _ in 0..4 {
            let last = *chain.last().unwrap();
            chain.push(add_scalar(&mut dtr, last, 1.0)); // costs 1 each: 4 in all
        }
        // The first link was evicted for the later ones; reading it reruns one op.
        assert!(!dtr.is_resident(chain[1]).unwrap());
        let read = dtr.get_value(chain[1]);
        dtr.check_invariants().unwrap();
        read
    };
    assert_eq!(run(1.0).unwrap(), vec![2.0; 1024]);
    let error = run(0.2).unwrap_err(); // 1 > 0.2 × 4
    assert!(matches!(error, Error::Thrash { limit: 0, .. }), "{error}");
    let bad = Interpreter::new(
        CpuBackend::new(),
        Config::default().with_remat_ratio_limit(-1.0),
    );
    assert!(matches!(bad, Err(Error::InvalidArgument(_))));
}
