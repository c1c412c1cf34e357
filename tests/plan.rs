//! Static plans: made from a DTR run, followed with no policy at their
//! planned offsets, with the same recomputations; a plan that does not
//! match its program is an error, not a wrong run.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use dtr::experiments::plan::Plan;
use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::trace::replay::ReplayStatus;
use dtr::Budget;

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("traces")
        .join(name)
}

fn spec(heuristic: &str, ratio: f64) -> RunSpec {
    RunSpec {
        policy: Policy::from(heuristic),
        budget: Budget::Ratio(ratio),
        ..RunSpec::default()
    }
}

/// Makes a plan and checks that following it repeats the run exactly.
fn plan_and_follow(workload: &Workload, spec: &RunSpec) -> Plan {
    let plan = Plan::make(workload, spec, 256).unwrap();
    plan.check().unwrap();
    let followed = plan.follow(workload).unwrap();
    assert_eq!(followed.overhead, plan.overhead, "the same recomputations");
    assert!(followed.report.peak_bytes <= plan.arena_bytes);
    assert_eq!(
        followed.report.stats.evictions as usize,
        plan.evictions() + followed.report.stats.eager_evictions as usize
    );
    plan
}

#[test]
fn plans_of_the_shipped_traces_are_followed_exactly() {
    for (trace, ratio) in [
        ("mlp-small.jsonl", 0.7),
        ("transformer-small.jsonl", 0.6),
        ("resnet-small.jsonl", 0.7),
    ] {
        let workload = Workload::load(&shipped(trace), None).unwrap();
        for heuristic in ["dtr", "dtr-eq", "dtr-next", "msps", "coop"] {
            let plan = plan_and_follow(&workload, &spec(heuristic, ratio));
            assert!(
                plan.evictions() > 0,
                "{trace} at {ratio} under {heuristic} should evict"
            );
        }
    }
}

#[test]
fn a_plan_fits_its_budget_when_a_tighter_run_allows() {
    // Small tensors (64 B): 256-byte blocks would waste most of the arena.
    let workload = Workload::load(&shipped("transformer-small.jsonl"), None).unwrap();
    let plan = Plan::make(&workload, &spec("dtr", 0.8), 16).unwrap();
    assert_eq!(plan.follow(&workload).unwrap().overhead, plan.overhead);
    let budget = (0.8 * workload.baseline.peak_bytes as f64).floor() as u64;
    assert_eq!(plan.budget_bytes, budget);
    assert!(plan.fits(), "{} B arena for {budget} B", plan.arena_bytes);
    assert!(plan.peak_bytes <= plan.arena_bytes);
}

/// Wherever the heuristic placing blocks as it goes completes in an arena
/// of the budget, a plan fits the budget: that run's own placement, if no
/// packing of a run that counted bytes does.
#[test]
fn a_plan_fits_wherever_the_dynamic_arena_run_completes() {
    use dtr::memory::MemoryModel;
    for trace in [
        "mlp-small.jsonl",
        "transformer-small.jsonl",
        "resnet-small.jsonl",
    ] {
        let workload = Workload::load(&shipped(trace), None).unwrap();
        for k in 4..=10 {
            let ratio = f64::from(k) / 10.0;
            let dynamic = RunSpec {
                memory: MemoryModel::arena(),
                ..spec("dtr", ratio)
            };
            let completes = dynamic.run(&workload).unwrap().report.status
                == dtr::trace::replay::ReplayStatus::Ok;
            if !completes {
                continue;
            }
            let plan = plan_and_follow(&workload, &spec("dtr", ratio));
            assert!(plan.fits(), "{trace} at {ratio}: {} B", plan.arena_bytes);
        }
    }
}

/// Where fragmentation stops the plain arena, the run moving blocks
/// (`arena-compact`) is the plan, its moves included: followed, it makes
/// the same moves at the same cost, never over the budget.
#[test]
fn a_plan_keeps_the_moves_of_a_compacting_run() {
    let workload = Workload::load(&shipped("torchvision/mobilenet_v2-b16.jsonl"), None).unwrap();
    let plan = plan_and_follow(&workload, &spec("dtr", 0.3));
    assert!(
        plan.fits(),
        "{} B for {} B",
        plan.arena_bytes,
        plan.budget_bytes
    );
    assert!(plan.moves() > 0, "the plan should move blocks");
    // Each allocation's stretches between moves: more than the allocations.
    let (stretches, _) = plan.placements().unwrap();
    assert!(stretches.len() > plan.lifetimes.len());
    let followed = plan.follow(&workload).unwrap();
    assert!(followed.report.stats.moved_bytes > 0);
    assert!(followed.report.peak_bytes <= plan.budget_bytes);

    // Written and read back, the same plan.
    let dir = std::env::temp_dir().join(format!("dtr-plan-moves-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.json");
    plan.write(&path).unwrap();
    assert_eq!(Plan::read(&path).unwrap(), plan);

    // A move onto a live block that never moves is refused when read, and
    // when followed.
    let moved: std::collections::HashSet<usize> = (plan.reservations.iter())
        .flat_map(|r| r.moves.iter().map(|m| m.allocation))
        .collect();
    let (k, step, live) = (plan.reservations.iter().filter(|r| !r.out_of_memory))
        .enumerate()
        .filter(|(_, r)| !r.moves.is_empty())
        .find_map(|(j, r)| {
            let step = 2 * j as u64 + 1;
            let live = (0..plan.lifetimes.len()).find(|a| {
                let l = plan.lifetimes[*a];
                !moved.contains(a) && l.bytes > 0 && l.start < step && step < l.end
            })?;
            let k = plan
                .reservations
                .iter()
                .position(|other| std::ptr::eq(other, r))?;
            Some((k, step, live))
        })
        .unwrap();
    let mut broken = plan.clone();
    broken.reservations[k].moves[0].to = plan.offsets[live];
    broken.write(&path).unwrap();
    let error = Plan::read(&path).unwrap_err().to_string();
    assert!(error.contains("not a valid plan"), "step {step}: {error}");
    let error = broken.follow(&workload).unwrap_err().to_string();
    assert!(error.contains("cannot move to offset"), "{error}");
    // A move of an allocation that does not exist.
    let mut broken = plan.clone();
    broken.reservations[k].moves[0].allocation = plan.lifetimes.len();
    assert!(broken.check().unwrap_err().contains("moves allocation"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_plan_only_fits_its_own_program() {
    let mlp = Workload::load(&shipped("mlp-small.jsonl"), None).unwrap();
    let plan = Plan::make(&mlp, &spec("dtr", 0.7), 256).unwrap();
    let other = Workload::load(&shipped("transformer-small.jsonl"), None).unwrap();
    let error = plan.follow(&other).unwrap_err().to_string();
    assert!(error.contains("events"), "{error}");
    // A victim that is not evictable where the plan says breaks it at that
    // reservation.
    let mut broken = plan.clone();
    let k = broken
        .reservations
        .iter()
        .position(|r| !r.evict.is_empty())
        .unwrap();
    broken.reservations[k].evict.clear();
    broken.reservations[k + 1].evict.push(u64::MAX);
    let error = broken.follow(&mlp).unwrap_err().to_string();
    assert!(
        error.contains("departs from the plan at reservation"),
        "{error}"
    );
    // The tensor is named as the plan file names it, not by an internal id.
    let mut broken = plan.clone();
    broken.reservations[k].evict.insert(0, u64::MAX);
    let error = broken.follow(&mlp).unwrap_err().to_string();
    assert!(
        error.contains(&format!("victim tensor {} (not in the program)", u64::MAX)),
        "{error}"
    );
    // The heuristic named is one dtr knows.
    let mut broken = plan.clone();
    broken.heuristic = "dtr-nxt".into();
    let error = broken.check().unwrap_err();
    assert!(error.contains("unknown heuristic `dtr-nxt`"), "{error}");
    // An alignment edited by hand is refused, not a panic of the arena.
    for alignment in [0, 3] {
        let mut broken = plan.clone();
        broken.alignment = alignment;
        let error = broken.check().unwrap_err();
        assert!(error.contains("power of two"), "{error}");
    }
}

#[test]
fn a_run_that_does_not_complete_has_no_plan() {
    let workload = Workload::load(&shipped("mlp-small.jsonl"), None).unwrap();
    let error = Plan::make(&workload, &spec("dtr", 0.01), 256)
        .unwrap_err()
        .to_string();
    assert!(error.contains("did not complete"), "{error}");
    let unbounded = RunSpec::default();
    assert!(Plan::make(&workload, &unbounded, 256).is_err());
}

#[test]
fn plan_then_replay_from_the_command_line() {
    let dir = std::env::temp_dir().join(format!("dtr-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("plan.json");
    let trace = shipped("transformer-small.jsonl");
    let dtr = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dtr"))
            .args(args)
            .output()
            .unwrap()
    };
    let made = dtr(&[
        "plan",
        trace.to_str().unwrap(),
        "--ratio",
        "0.6",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let printed = String::from_utf8_lossy(&made.stdout);
    assert!(printed.contains("planned arena"), "{printed}");
    // Made from the recorded program, a plan looks ahead by default.
    assert!(printed.contains("planned with `dtr-next`"), "{printed}");
    let followed = dtr(&[
        "replay",
        trace.to_str().unwrap(),
        "--plan",
        out.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        followed.status.success(),
        "{}",
        String::from_utf8_lossy(&followed.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&followed.stdout).unwrap();
    assert_eq!(result["status"], "ok");
    assert!(result["peak_bytes"].as_u64() <= result["arena_bytes"].as_u64());
    // The plan is never written over its input.
    let refused = dtr(&[
        "plan",
        trace.to_str().unwrap(),
        "--ratio",
        "0.6",
        "--out",
        trace.to_str().unwrap(),
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("would be overwritten"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plans_of_the_authors_logs_are_followed_exactly() {
    let Some(logs) = common::prototype_logs() else {
        return;
    };
    for log in logs {
        let workload = Workload::load(&log, None).unwrap();
        // UNet under `dtr` at 0.5 completes counting bytes, but no run's
        // packing fits: the compacting arena's run, moves and all, does.
        let plan = plan_and_follow(&workload, &spec("dtr", 0.5));
        assert!(plan.fits(), "{}", log.display());
    }
}

/// A run in the plain arena whose op was tried again with its outputs'
/// blocks reserved first (the shipped GPT-2 step under `dtr-next` at 0.56
/// of its peak) records that reservation as such; followed, the plan
/// reserves them first there too and ends exactly, at the run's cost.
#[test]
fn a_plan_recorded_in_an_arena_reserves_outputs_first_where_its_run_did() {
    use dtr::memory::MemoryModel;
    let workload = Workload::load(&shipped("pytorch/gpt2-6l.jsonl"), None).unwrap();
    let recording = RunSpec {
        memory: MemoryModel::arena(),
        ..spec("dtr-next", 0.56)
    };
    let (recorded, dtr) = recording
        .run_with(&workload, false, |dtr| dtr.record_plan(), |_, _| {})
        .unwrap();
    assert_eq!(recorded.report.status, ReplayStatus::Ok);
    assert!(recorded.report.stats.outputs_reserved_first > 0);
    let record = dtr.plan_record().unwrap();
    assert!(record.reservations.iter().any(|r| r.outputs_first));
    let following = RunSpec {
        budget: Budget::Bytes(recorded.budget_bytes.unwrap()),
        memory: MemoryModel::arena(),
        thrash_limit: f64::INFINITY,
        ..RunSpec::default()
    };
    let (followed, dtr) = following
        .run_with(
            &workload,
            false,
            |dtr| dtr.follow_plan(record.reservations.clone(), Some(record.offsets.clone())),
            |_, _| {},
        )
        .unwrap();
    assert_eq!(
        followed.report.status,
        ReplayStatus::Ok,
        "{:?}",
        followed.report.message
    );
    assert!(dtr.plan_finished());
    let (before, after) = (&recorded.report.stats, &followed.report.stats);
    assert_eq!(after.compute, before.compute);
    assert_eq!(after.outputs_reserved_first, before.outputs_reserved_first);
}
