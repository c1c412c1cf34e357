//! The smallest budget a trace runs in: bisection over the ratio of the
//! unbounded peak, for each policy and memory model (`dtr fit`).
//!
//! Bisection assumes that a run which completes at some ratio completes at
//! every larger one. That is usual but not guaranteed (a larger budget can
//! change early decisions for the worse), so the answer is the smallest
//! ratio found to complete with everything probed above it completing too:
//! a budget a user can rely on, not a proof that nothing smaller works.

use serde::{Deserialize, Serialize};

use super::run::{RunSpec, Workload};
use crate::config::Budget;
use crate::error::{Error, Result};
use crate::trace::replay::ReplayStatus;

/// The result of a search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    /// The smallest ratio of the unbounded peak that completed, or `None`
    /// when even 1.0 did not (within the thrash limit).
    pub ratio: Option<f64>,
    /// Its budget in bytes.
    pub budget_bytes: Option<u64>,
    /// Compute over the unbounded run's, at that ratio.
    pub overhead: Option<f64>,
    /// The largest ratio below it that was tried and did not complete
    /// (within `precision` of `ratio`; `None` if nothing below was tried).
    pub fails_at: Option<f64>,
    /// Replays run by the search.
    pub probes: usize,
}

/// Bisects `[0, 1]` for the smallest ratio at which `spec` completes on
/// `workload`, until the bracket is narrower than `precision`. The spec's
/// budget is ignored; its policy must take one.
pub fn smallest_ratio(workload: &Workload, spec: &RunSpec, precision: f64) -> Result<Fit> {
    if !(precision > 0.0 && precision < 1.0) {
        return Err(Error::InvalidArgument(format!(
            "the precision must be in (0, 1), got {precision}"
        )));
    }
    if !spec.policy.takes_budget() {
        return Err(Error::InvalidArgument(format!(
            "`{}` is a static plan; it has no budget to fit",
            spec.policy.name()
        )));
    }
    bisect(precision, |ratio| {
        let spec = RunSpec {
            budget: Budget::Ratio(ratio),
            ..spec.clone()
        };
        let outcome = spec.run(workload)?;
        Ok((outcome.report.status == ReplayStatus::Ok)
            .then_some((outcome.budget_bytes, outcome.overhead)))
    })
}

/// Bisects `[0, 1]` for the smallest ratio at which `probe` succeeds (with
/// its budget in bytes and overhead), until the bracket is narrower than
/// `precision`; 1.0 is probed first.
pub fn bisect(
    precision: f64,
    mut probe: impl FnMut(f64) -> Result<Option<(Option<u64>, f64)>>,
) -> Result<Fit> {
    let mut probes = 0;
    let mut probe = |ratio: f64| {
        probes += 1;
        probe(ratio)
    };
    let Some(mut best) = probe(1.0)? else {
        return Ok(Fit {
            ratio: None,
            budget_bytes: None,
            overhead: None,
            fails_at: None,
            probes,
        });
    };
    let (mut fails, mut completes) = (0.0, 1.0);
    while completes - fails > precision {
        let middle = (fails + completes) / 2.0;
        match probe(middle)? {
            Some(outcome) => {
                completes = middle;
                best = outcome;
            }
            None => fails = middle,
        }
    }
    Ok(Fit {
        ratio: Some(completes),
        budget_bytes: best.0,
        overhead: Some(best.1),
        // 0 is never run: nothing fits in no memory.
        fails_at: (fails > 0.0).then_some(fails),
        probes,
    })
}
