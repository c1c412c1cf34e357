//! Issue 15: more memory should not make a run fail. On the authors'
//! ResNet-32 and LSTM logs (counter memory, `dtr`), a released tensor
//! evicted at once lengthens the recomputation of an evicted tensor still
//! held by its whole released history; the cascade thrashes (or runs out of
//! memory under the locks it piles up) at budgets above ones that complete.
//! [`dtr::Config::keep_needed_history`] keeps such history resident: every
//! ratio from the first that completes up to 1.00 then completes.

mod common;

use dtr::experiments::{Policy, RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::trace::replay::ReplayStatus;
use dtr::Budget;

fn log(prefix: &str) -> Option<Workload> {
    Some(Workload::load(&common::prototype_log(prefix)?, None).unwrap())
}

fn status(workload: &Workload, ratio: f64, keep: bool) -> ReplayStatus {
    RunSpec {
        budget: Budget::Ratio(ratio),
        keep_needed_history: Some(keep),
        policy: Policy::from("dtr"),
        ..RunSpec::default()
    }
    .run(workload)
    .unwrap()
    .report
    .status
}

/// Ratios `from`, `from + 0.01`, …, 1.00, as the sweep writes them.
fn ratios_from(from: u32) -> impl Iterator<Item = f64> {
    (from..=100).map(|r| r as f64 / 100.0)
}

#[test]
fn resnet32_thrashed_at_a_budget_above_one_that_completes() {
    let Some(resnet) = log("resnet32") else {
        return;
    };
    assert_eq!(status(&resnet, 0.16, false), ReplayStatus::Ok);
    assert_eq!(status(&resnet, 0.17, false), ReplayStatus::Thrash);
    assert_eq!(status(&resnet, 0.18, false), ReplayStatus::Ok);
    for ratio in ratios_from(14) {
        assert_eq!(status(&resnet, ratio, true), ReplayStatus::Ok, "{ratio}");
    }
}

#[test]
fn lstm_completes_at_every_ratio_from_its_first() {
    let Some(lstm) = log("lstm") else {
        return;
    };
    assert_eq!(status(&lstm, 0.20, false), ReplayStatus::Ok);
    assert_eq!(status(&lstm, 0.21, false), ReplayStatus::OutOfMemory);
    assert_eq!(status(&lstm, 0.22, false), ReplayStatus::Thrash);
    for ratio in ratios_from(17) {
        assert_eq!(status(&lstm, ratio, true), ReplayStatus::Ok, "{ratio}");
    }
}

/// The replays' default, `dtr-next`, guards against cascades: it keeps
/// needed history and holds back a storage whose depth-first
/// rematerialisation could not fit. On U-Net that storage is a skip
/// connection's gradient: unguarded it runs out of memory at 0.30 and
/// 0.33 (completing at 0.32); guarded, U-Net completes at every ratio from
/// 0.27, counting bytes and in the compacting arena.
#[test]
fn unet_completes_at_every_ratio_from_its_first_under_the_replays_default() {
    let Some(unet) = log("unet") else {
        return;
    };
    let run = |ratio: f64, memory: MemoryModel, guarded: Option<bool>| {
        RunSpec {
            budget: Budget::Ratio(ratio),
            memory,
            keep_needed_history: guarded,
            remat_memory_guard: guarded,
            ..RunSpec::default()
        }
        .run(&unet)
        .unwrap()
        .report
        .status
    };
    let unguarded = |ratio| run(ratio, MemoryModel::Counter, Some(false));
    assert_eq!(unguarded(0.30), ReplayStatus::OutOfMemory);
    assert_eq!(unguarded(0.32), ReplayStatus::Ok);
    assert_eq!(unguarded(0.33), ReplayStatus::OutOfMemory);
    for memory in [
        MemoryModel::Counter,
        MemoryModel::CompactingArena { alignment: 256 },
    ] {
        for ratio in ratios_from(27) {
            assert_eq!(
                run(ratio, memory, None),
                ReplayStatus::Ok,
                "{memory} {ratio}"
            );
        }
    }
}

/// Plain-arena cells that thrashed above a ratio that completes, under
/// the replays' default, before two changes. InceptionV4 (0.41, 0.43,
/// 0.51) and DenseNet-121 (0.24) thrashed in the pins at the end of the
/// log, where rematerialising one evicted output (a weight's gradient)
/// evicted others already resident: `pin_resident_first` pins those
/// first. These and TreeLSTM at 0.13 also thrashed in windows whose cost
/// had become NaN (an infinite price slid out of the window: `∞ − ∞`), so
/// the first window seen stuck however much it cost and evicted storages
/// needed at once.
#[test]
fn plain_arena_cells_that_thrashed_complete_under_the_replays_default() {
    let logs = (log("inceptionv4"), log("tv_densenet121"), log("treelstm"));
    let (Some(inception), Some(densenet), Some(treelstm)) = logs else {
        return;
    };
    for (workload, ratio) in [
        (&inception, 0.41),
        (&inception, 0.42),
        (&inception, 0.43),
        (&inception, 0.51),
        (&densenet, 0.24),
        (&treelstm, 0.13),
    ] {
        let outcome = RunSpec {
            budget: Budget::Ratio(ratio),
            memory: MemoryModel::arena(),
            ..RunSpec::default()
        }
        .run(workload)
        .unwrap();
        assert_eq!(outcome.report.status, ReplayStatus::Ok, "{ratio}");
    }
}

#[test]
fn only_the_replays_default_pins_resident_outputs_first_unless_told() {
    let next = RunSpec::default();
    assert!(next.pins_resident_first());
    let authors = RunSpec {
        policy: Policy::Heuristic("dtr".into()),
        ..RunSpec::default()
    };
    assert!(!authors.pins_resident_first());
    let asked = RunSpec {
        pin_resident_first: Some(true),
        ..authors
    };
    assert!(asked.pins_resident_first());
}
