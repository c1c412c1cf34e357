//! Each heuristic on a small hand-made graph where the right victim is
//! known from its formula. Ops are recorded ops on the simulator, so sizes
//! and costs are exact; the clock starts at 1 and advances by each op's cost.

use dtr::memory::MemoryModel;
use dtr::ops::{RecordedOp, RecordedOutput};
use dtr::{Config, Event, Interpreter, Op, SimulatorBackend, TensorId};

type Sim = Interpreter<SimulatorBackend>;

fn sim(config: Config) -> Sim {
    Interpreter::new(SimulatorBackend::new(), config.with_events(true)).unwrap()
}

/// An op of `cost` reading `inputs` and making one fresh output of `bytes`
/// (or nothing when `bytes` is `None`: a pure tick of the clock).
fn op(dtr: &mut Sim, inputs: &[TensorId], cost: u64, bytes: Option<u64>) -> Option<TensorId> {
    let outputs = bytes
        .map(|bytes| RecordedOutput {
            bytes,
            alias_of: None,
        })
        .into_iter()
        .collect();
    let recorded = Op::Recorded(RecordedOp {
        call: 0,
        module: None,
        name: "op".into(),
        cost,
        outputs,
    });
    dtr.apply_op(recorded, inputs).unwrap().first().copied()
}

fn tensor(dtr: &mut Sim, inputs: &[TensorId], cost: u64, bytes: u64) -> TensorId {
    op(dtr, inputs, cost, Some(bytes)).unwrap()
}

/// Storages evicted by pressure (not eagerly), by their tensors.
fn evicted(dtr: &Sim) -> Vec<TensorId> {
    dtr.events()
        .iter()
        .filter_map(|e| match e {
            Event::Evict {
                tensor,
                eager: false,
                ..
            } => Some(*tensor),
            _ => None,
        })
        .collect()
}

/// a (100 B, cost 10, oldest), b (300 B, cost 10), c (100 B, cost 1), then
/// a tick of 100 so every staleness is positive, then a 100-byte request
/// that forces one eviction. At that point the clock is 122 and the last
/// accesses are a = 11, b = 21, c = 22.
fn three_candidates(heuristic: &str, seed: u64) -> (Vec<TensorId>, [TensorId; 3]) {
    let mut dtr = sim(Config::default().with_heuristic(heuristic).with_seed(seed));
    let a = tensor(&mut dtr, &[], 10, 100);
    let b = tensor(&mut dtr, &[], 10, 300);
    let c = tensor(&mut dtr, &[], 1, 100);
    op(&mut dtr, &[], 100, None);
    dtr.set_budget_bytes(Some(500));
    tensor(&mut dtr, &[], 1, 100);
    (evicted(&dtr), [a, b, c])
}

#[test]
fn lru_evicts_the_least_recently_used() {
    let (victims, [a, _, _]) = three_candidates("lru", 0);
    assert_eq!(victims, vec![a]);
}

#[test]
fn size_evicts_the_largest() {
    let (victims, [_, b, _]) = three_candidates("size", 0);
    assert_eq!(victims, vec![b]);
}

#[test]
fn dtr_local_weighs_cost_size_and_staleness() {
    // a: 10/(100·111) = 9.0e-4, b: 10/(300·101) = 3.3e-4, c: 1/(100·100) = 1.0e-4.
    let (victims, [_, _, c]) = three_candidates("dtr-local", 0);
    assert_eq!(victims, vec![c]);
}

#[test]
fn msps_ignores_staleness() {
    // a: 10/100, b: 10/300, c: 1/100: the cheapest per byte is c.
    let (victims, [_, _, c]) = three_candidates("msps", 0);
    assert_eq!(victims, vec![c]);
}

#[test]
fn random_is_seeded() {
    let (first, _) = three_candidates("random", 7);
    assert_eq!(
        first,
        three_candidates("random", 7).0,
        "same seed, same victim"
    );
    let distinct: std::collections::HashSet<_> = (0..32)
        .map(|seed| three_candidates("random", seed).0)
        .collect();
    assert!(
        distinct.len() > 1,
        "different seeds should not always pick the same victim"
    );
}

/// p (cost 1) → q (cost 50, evicted) → r (cost 1), and an unrelated s
/// (cost 5), all 100 B; then a tick of 1000 and a 100-byte request.
/// Only the neighbourhood-aware heuristics see that evicting p or r would
/// make recomputing q (cost 50) harder: (1 + 50) against s's 5.
fn neighbourhood(heuristic: &str) -> (Vec<TensorId>, [TensorId; 3]) {
    let mut dtr = sim(Config::default().with_heuristic(heuristic));
    let p = tensor(&mut dtr, &[], 1, 100);
    let q = tensor(&mut dtr, &[p], 50, 100);
    let r = tensor(&mut dtr, &[q], 1, 100);
    let s = tensor(&mut dtr, &[], 5, 100);
    dtr.del(q).unwrap(); // evicted eagerly: r still depends on it
    op(&mut dtr, &[], 1000, None);
    dtr.set_budget_bytes(Some(300));
    tensor(&mut dtr, &[], 1, 100);
    (evicted(&dtr), [p, r, s])
}

#[test]
fn neighbourhood_aware_heuristics_protect_the_evicted_neighbours() {
    for heuristic in ["dtr", "dtr-walk", "dtr-eq"] {
        let (victims, [_, _, s]) = neighbourhood(heuristic);
        assert_eq!(victims, vec![s], "{heuristic}");
    }
    let (victims, [p, r, _]) = neighbourhood("dtr-local");
    assert!(
        victims == vec![p] || victims == vec![r],
        "dtr-local sees only own cost: {victims:?}"
    );
}

/// p (cost 1) → q (cost 50), an unrelated s (cost 5) and x (cost 1), all
/// 100 B. q is evicted and a first eviction (of x) scores p while q counts
/// in its neighbourhood (1 + 50). q is then rematerialised and freed before
/// the next eviction: p's neighbourhood is empty again, so after a tick of
/// 1000 p (1 / 1050) goes before s (5 / 2061) and y (10 / 1050). The cached
/// `dtr` once kept p's stale region cost here: q's rematerialisation was
/// settled lazily, and by then q and its edge from p were gone. Eight
/// costly bystanders (cost 1000) keep the cache large enough that it is
/// invalidated storage by storage rather than cleared.
fn rematerialised_then_freed(heuristic: &str) -> (Vec<TensorId>, [TensorId; 4]) {
    let mut dtr = sim(Config::default().with_heuristic(heuristic));
    for _ in 0..8 {
        tensor(&mut dtr, &[], 1000, 100);
    }
    let p = tensor(&mut dtr, &[], 1, 100);
    let q = tensor(&mut dtr, &[p], 50, 100);
    let s = tensor(&mut dtr, &[], 5, 100);
    let x = tensor(&mut dtr, &[], 1, 100);
    op(&mut dtr, &[], 1000, None);
    assert!(dtr.evict_now(q).unwrap());
    dtr.set_budget_bytes(Some(1100));
    tensor(&mut dtr, &[], 10, 100); // y: evicts x, the stalest per cost
    dtr.set_budget_bytes(Some(1200));
    dtr.ensure_resident(q).unwrap();
    dtr.del(q).unwrap(); // no consumers: freed for good
    op(&mut dtr, &[], 1000, None);
    dtr.set_budget_bytes(Some(1100));
    tensor(&mut dtr, &[], 1, 100);
    (evicted(&dtr), [p, q, s, x])
}

#[test]
fn dtr_forgets_a_rematerialised_storage_freed_before_the_next_eviction() {
    for heuristic in ["dtr-walk", "dtr"] {
        let (victims, [p, q, _, x]) = rematerialised_then_freed(heuristic);
        // q by `evict_now`, then x and p by pressure.
        assert_eq!(victims, vec![q, x, p], "{heuristic}");
    }
}

/// An arena of 400 B holding a, b, c, d (100 B each, cost 10, a oldest);
/// c is freed, leaving a 100-byte hole between b and d; then a 200-byte
/// request. Evicting a (the stalest) opens a hole that does not touch c's:
/// only a storage beside the hole (b or d) makes room in one eviction.
fn fragmented(heuristic: &str) -> (Vec<TensorId>, [TensorId; 4]) {
    let config = Config::default()
        .with_heuristic(heuristic)
        .with_budget_bytes(400)
        .with_memory(MemoryModel::Arena { alignment: 4 });
    let mut dtr = sim(config);
    let a = tensor(&mut dtr, &[], 10, 100);
    let b = tensor(&mut dtr, &[], 10, 100);
    let c = tensor(&mut dtr, &[], 10, 100);
    let d = tensor(&mut dtr, &[], 10, 100);
    dtr.del(c).unwrap(); // no dependents: freed, leaving the hole
    op(&mut dtr, &[], 1000, None);
    let report = dtr.memory().arena.unwrap();
    assert_eq!((report.largest_free_bytes, report.free_blocks), (100, 1));
    tensor(&mut dtr, &[], 1, 200);
    (evicted(&dtr), [a, b, c, d])
}

#[test]
fn fragmentation_blind_eviction_needs_two_victims() {
    let (victims, [a, b, _, _]) = fragmented("dtr-eq");
    assert_eq!(
        victims,
        vec![a, b],
        "dtr-eq takes the stalest first, then the neighbour"
    );
}

#[test]
fn dte_counts_adjacent_free_space() {
    // b: 10/((100 + 100)·1020) beats a: 10/(100·1030).
    let (victims, [_, b, _, _]) = fragmented("dte");
    assert_eq!(victims, vec![b]);
}

#[test]
fn coop_evicts_the_cheapest_window_covering_the_request() {
    // Windows of ≥ 200 B: [b, hole] costs b, [hole, d] costs d, [a, b] costs a + b;
    // b is staler than d, so it is the cheapest.
    let (victims, [_, b, _, _]) = fragmented("coop");
    assert_eq!(victims, vec![b]);
}

#[test]
fn arena_allocation_fails_on_fragmentation_when_nothing_can_move() {
    let config = Config::default()
        .with_budget_bytes(400)
        .with_memory(MemoryModel::Arena { alignment: 4 });
    let mut dtr = sim(config);
    let puts: Vec<TensorId> = (0..4).map(|_| dtr.put_opaque(100).unwrap()).collect();
    dtr.del(puts[1]).unwrap();
    dtr.del(puts[3]).unwrap();
    // 200 B are free, in two holes: puts cannot be evicted, so this must fail.
    let err = dtr.put_opaque(200).unwrap_err();
    assert!(matches!(err, dtr::Error::OutOfMemory { .. }), "{err}");
    dtr.check_invariants().unwrap();
    assert!(
        dtr.put_opaque(100).is_ok(),
        "a single hole still serves 100 B"
    );
}

#[test]
fn arena_budget_can_be_set_late_raised_and_lifted() {
    // Created unbounded: the arena opens when the budget arrives.
    let mut dtr = sim(Config::default().with_memory(MemoryModel::Arena { alignment: 4 }));
    dtr.set_budget_bytes(Some(200));
    let a = tensor(&mut dtr, &[], 1, 100);
    assert_eq!(dtr.memory().arena.unwrap().capacity_bytes, 200);
    // Raised: more room at the end; lifted: no limit at all.
    dtr.set_budget_bytes(Some(400));
    tensor(&mut dtr, &[], 1, 300);
    dtr.set_budget_bytes(None);
    tensor(&mut dtr, &[a], 1, 10_000);
    assert_eq!(dtr.stats().evictions, 0);
    dtr.check_invariants().unwrap();
}

/// The end of a language model's step, in miniature (costs in brackets,
/// sizes in bytes): the head's weight `w` (a 10 B put) and the hidden state
/// `h` (10, [1]) make the logits (100, [1]); log-softmax `ls` (100, [1]),
/// its gradient `gls` (100, [1]) and the logits' gradient `gl` (100, [1],
/// reading `gls` and `ls`) follow, each dropped once used, so they are
/// history. `s` (20, [1]) reads `gl` and `h` and is held to the end, like a
/// tied weight's first gradient waiting for the second. An activation `b`
/// (60, [100]) and three more (30, [1]) are made from `h`. Three backward
/// steps then each turn an activation into a 30-byte gradient [1000] that
/// becomes a constant (detached) and make a temporary [1] of 150, 150 and
/// 200 B. Only the last one needs an eviction: 390 B against the budget of
/// 350, with 100 B of constants resident. At the end `s` and `b` are read.
///
/// Recomputing `s` runs `gl`'s op, which needs `gls`, `ls` and its output,
/// 300 B, at once: over the 100 B of constants, more than the budget.
/// Without the guard, `dtr` evicts `s` (cost 1 + 4 of evicted ancestors per
/// 20 B) before `h` and `b` (cost 100 per 60 B), and the step cannot finish.
/// With it, `s` is held back, `h` and `b` go, and `b` comes back at cost 100.
fn tied_gradient_at_the_end(heuristic: &str, guard: bool) -> (dtr::Result<()>, Sim, [TensorId; 3]) {
    let mut dtr = sim(Config::default()
        .with_heuristic(heuristic)
        .with_budget_bytes(350)
        .with_remat_memory_guard(guard));
    let w = dtr.put_opaque(10).unwrap();
    let h = tensor(&mut dtr, &[w], 1, 10);
    let logits = tensor(&mut dtr, &[h, w], 1, 100);
    let ls = tensor(&mut dtr, &[logits], 1, 100);
    dtr.del(logits).unwrap();
    let gls = tensor(&mut dtr, &[ls], 1, 100);
    let gl = tensor(&mut dtr, &[gls, ls], 1, 100);
    dtr.del(gls).unwrap();
    dtr.del(ls).unwrap();
    let s = tensor(&mut dtr, &[gl, h], 1, 20);
    dtr.del(gl).unwrap();
    let b = tensor(&mut dtr, &[h], 100, 60);
    let acts: Vec<TensorId> = (0..3).map(|_| tensor(&mut dtr, &[h], 1, 30)).collect();
    assert!(evicted(&dtr).is_empty());
    let mut run = || -> dtr::Result<()> {
        for (&act, temporary) in acts.iter().zip([150, 150, 200]) {
            let grad = dtr.apply_op(Op::recorded("op", 1000, 30), &[act])?[0];
            dtr.detach(grad)?;
            dtr.del(act)?;
            let temporary = dtr.apply_op(Op::recorded("op", 1, temporary), &[grad])?[0];
            dtr.del(temporary)?;
        }
        let end = dtr.apply_op(Op::recorded("op", 1, 20), &[s, b])?[0];
        dtr.del(end)
    };
    let result = run();
    dtr.check_invariants().unwrap();
    (result, dtr, [h, s, b])
}

#[test]
fn a_storage_whose_rematerialisation_cannot_fit_is_evicted_last() {
    let (result, dtr, [h, s, b]) = tied_gradient_at_the_end("dtr", false);
    assert!(
        matches!(result, Err(dtr::Error::OutOfMemory { .. })),
        "without the guard: {result:?}"
    );
    assert_eq!(evicted(&dtr)[..3], [s, h, b]);
    let (result, dtr, _) = tied_gradient_at_the_end("dtr", true);
    result.unwrap();
    assert_eq!(evicted(&dtr), [h, b]);
    for heuristic in ["dtr-eq", "dtr-local", "msps", "lru", "size", "coop"] {
        let (result, dtr, [_, s, _]) = tied_gradient_at_the_end(heuristic, true);
        result.unwrap_or_else(|error| panic!("{heuristic}: {error}"));
        assert!(!evicted(&dtr).contains(&s), "{heuristic}");
        assert!(dtr.memory().peak_bytes <= 350, "{heuristic}");
    }
}

/// A held tensor `s` (10 B) reads `b` and `d` (100 B each), each made from
/// a 100 B tensor (`a`, `c`) made from a 10 B constant; all four are
/// released, so recomputing `s` runs `a`, `b` (locked for `s`), then `c`
/// and `d`: 300 B at once, though no single op needs more than 210. Under
/// a budget of 300 B, set once they are made, a temporary of 230 B then
/// needs 10 B. `dtr` prefers
/// `s` (cost 5 with its evicted history, per 10 B) to `h` (cost 100 per
/// 60 B). Without the guard, and pending rematerialisations keeping their
/// locks, `s` cannot come back at the end; with it, the guard adds up the
/// whole depth-first rematerialisation, holds `s` back and evicts `h`.
fn nested_rematerialisation(guard: bool) -> (dtr::Result<()>, Sim, TensorId) {
    let mut dtr = sim(Config::default()
        .with_lock_relaxation(false)
        .with_remat_memory_guard(guard));
    let x = dtr.put_opaque(10).unwrap();
    let a = tensor(&mut dtr, &[x], 1, 100);
    let b = tensor(&mut dtr, &[a], 1, 100);
    dtr.del(a).unwrap();
    let c = tensor(&mut dtr, &[x], 1, 100);
    let d = tensor(&mut dtr, &[c], 1, 100);
    dtr.del(c).unwrap();
    let s = tensor(&mut dtr, &[b, d], 1, 10);
    dtr.del(b).unwrap();
    dtr.del(d).unwrap();
    let h = tensor(&mut dtr, &[x], 100, 60);
    dtr.set_budget_bytes(Some(300));
    let mut run = || -> dtr::Result<()> {
        let temporary = dtr.apply_op(Op::recorded("op", 1, 230), &[x])?[0];
        dtr.del(temporary)?;
        let end = dtr.apply_op(Op::recorded("op", 1, 20), &[s, h])?[0];
        dtr.del(end)
    };
    let result = run();
    dtr.check_invariants().unwrap();
    (result, dtr, s)
}

#[test]
fn the_guard_adds_up_a_rematerialisation_deeper_than_one_op() {
    let (result, dtr, s) = nested_rematerialisation(false);
    assert!(
        matches!(result, Err(dtr::Error::OutOfMemory { .. })),
        "without the guard: {result:?}"
    );
    assert_eq!(evicted(&dtr)[0], s);
    let (result, dtr, s) = nested_rematerialisation(true);
    result.unwrap();
    assert_eq!(evicted(&dtr).len(), 1);
    assert_ne!(evicted(&dtr)[0], s);
}
