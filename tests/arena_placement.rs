//! First-fit placement in the arena (`arena-ff`): on a log where best fit
//! thrashes at a budget larger than one it completes at, first fit
//! completes both.

mod common;

use dtr::experiments::{RunSpec, Workload};
use dtr::memory::MemoryModel;
use dtr::trace::replay::ReplayStatus;
use dtr::Budget;

#[test]
fn memory_models_round_trip_through_their_names() {
    for name in ["counter", "arena", "arena:512", "arena-ff", "arena-ff:512"] {
        let model: MemoryModel = name.parse().unwrap();
        assert_eq!(model.to_string(), name);
    }
    assert!("arena-ff:3".parse::<MemoryModel>().is_err());
}

/// InceptionV4 with `dtr` in an arena of exactly the budget: best fit
/// completes at 0.47 of the peak but thrashes at 0.56 (fragmentation: the
/// evictions that open a hole free far more than the request); first fit
/// completes at both.
#[test]
fn first_fit_completes_where_best_fit_thrashes_above_a_completing_budget() {
    let Some(logs) = common::prototype_logs() else {
        return;
    };
    let log = logs
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("inceptionv4")
        })
        .unwrap();
    let workload = Workload::load(log, None).unwrap();
    let run = |memory: &str, ratio: f64| {
        RunSpec {
            budget: Budget::Ratio(ratio),
            memory: memory.parse().unwrap(),
            ..RunSpec::default()
        }
        .run(&workload)
        .unwrap()
        .report
        .status
    };
    assert_eq!(run("arena", 0.47), ReplayStatus::Ok);
    assert_eq!(run("arena", 0.56), ReplayStatus::Thrash);
    assert_eq!(run("arena-ff", 0.47), ReplayStatus::Ok);
    assert_eq!(run("arena-ff", 0.56), ReplayStatus::Ok);
}
