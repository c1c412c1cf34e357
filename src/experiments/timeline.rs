//! Memory over the logical clock of one replay: bytes in use after each
//! trace event, the evictions and rematerialisations each event caused, and
//! the arena's fragmentation in arena mode.

use crate::backend::Backend;
use crate::interp::Interpreter;

/// The state after one trace event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The trace event's index (the logical clock).
    pub clock: usize,
    /// Bytes in use after it.
    pub in_use_bytes: u64,
    /// Evictions (eager ones included) made while running this event.
    pub evictions: u64,
    /// Rematerialisations made while running this event.
    pub rematerializations: u64,
    /// `1 − largest free block / free bytes`, in arena mode.
    pub fragmentation: Option<f64>,
}

/// One replay's samples, in clock order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// The budget at the last sample (`None`: unbounded).
    pub budget_bytes: Option<u64>,
    /// One per observed event.
    pub samples: Vec<Sample>,
    evictions_so_far: u64,
    rematerializations_so_far: u64,
}

impl Timeline {
    /// An empty timeline.
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// Records the state after trace event `clock` (pass it as
    /// [`crate::trace::replay::replay_observed`]'s callback).
    pub fn observe<B: Backend>(&mut self, clock: usize, dtr: &Interpreter<B>) {
        let memory = dtr.memory();
        let stats = dtr.stats();
        self.budget_bytes = memory.budget_bytes;
        self.samples.push(Sample {
            clock,
            in_use_bytes: memory.in_use_bytes,
            evictions: stats.evictions - self.evictions_so_far,
            rematerializations: stats.rematerializations - self.rematerializations_so_far,
            fragmentation: memory.arena.map(|arena| arena.fragmentation),
        });
        self.evictions_so_far = stats.evictions;
        self.rematerializations_so_far = stats.rematerializations;
    }

    /// At most `buckets` samples, each covering a run of clocks: the
    /// highest bytes in use and fragmentation of its run, and the sums of
    /// its evictions and rematerialisations (for drawing long replays).
    pub fn downsampled(&self, buckets: usize) -> Vec<Sample> {
        let per_bucket = self.samples.len().div_ceil(buckets.max(1)).max(1);
        self.samples
            .chunks(per_bucket)
            .map(|run| Sample {
                clock: run[0].clock,
                in_use_bytes: run.iter().map(|s| s.in_use_bytes).max().unwrap_or(0),
                evictions: run.iter().map(|s| s.evictions).sum(),
                rematerializations: run.iter().map(|s| s.rematerializations).sum(),
                fragmentation: run
                    .iter()
                    .filter_map(|s| s.fragmentation)
                    .max_by(f64::total_cmp),
            })
            .collect()
    }

    /// `clock,in_use_bytes,evictions,rematerializations,fragmentation`, one
    /// line per sample (fragmentation empty in counter mode).
    pub fn to_csv(&self) -> String {
        let mut csv =
            String::from("clock,in_use_bytes,evictions,rematerializations,fragmentation\n");
        for s in &self.samples {
            let fragmentation = s.fragmentation.map_or(String::new(), |f| f.to_string());
            csv += &format!(
                "{},{},{},{},{fragmentation}\n",
                s.clock, s.in_use_bytes, s.evictions, s.rematerializations
            );
        }
        csv
    }
}

/// One replay in the Chrome trace event format (opens in Perfetto and
/// `chrome://tracing`): each trace event's op as a slice, the
/// rematerialisations it needed as a distinct slice inside it with an
/// instant per recomputed op, memory in use (and in arena mode the
/// fragmentation) as counters, and each eviction as an instant event with
/// the victim's size and score.
///
/// The clock is compute: a slice lasts as many microseconds as the cost
/// units it spent (the trace's `cost`, FLOPs or measured time), so long
/// stretches are the expensive ones.
#[derive(Debug, Clone, Default)]
pub struct ChromeTrace {
    events: Vec<serde_json::Value>,
    /// Interpreter events (evictions, rematerialisations) already written.
    logged: usize,
    compute: u64,
    remat_compute: u64,
}

impl ChromeTrace {
    /// An empty trace.
    pub fn new() -> ChromeTrace {
        ChromeTrace::default()
    }

    /// Records trace event `index` (`event`, from `line` of the trace) after
    /// it ran on `dtr`, which must keep its event log
    /// ([`crate::Config::with_events`]).
    pub fn observe<B: Backend>(
        &mut self,
        index: usize,
        event: &crate::trace::TraceEvent,
        line: usize,
        dtr: &Interpreter<B>,
    ) {
        use crate::interp::Event;
        use crate::trace::TraceEvent;
        use serde_json::json;
        let stats = dtr.stats();
        let memory = dtr.memory();
        let start = self.compute as f64;
        let spent = stats.compute.saturating_sub(self.compute);
        let remat = stats.remat_compute.saturating_sub(self.remat_compute);
        let new_events = dtr.events().get(self.logged..).unwrap_or_default();
        let (name, category, args) = match event {
            TraceEvent::Apply(apply) => (
                apply.op.to_string(),
                "op",
                json!({"trace_line": line, "cost": apply.cost, "module": apply.module}),
            ),
            other => (
                match other {
                    TraceEvent::Put { .. } => "put",
                    TraceEvent::Retain { .. } => "retain",
                    TraceEvent::Del { .. } => "del",
                    TraceEvent::Get { .. } => "get",
                    TraceEvent::Pin { .. } => "pin",
                    TraceEvent::Unpin { .. } => "unpin",
                    TraceEvent::Detach { .. } => "detach",
                    TraceEvent::Apply { .. } => unreachable!("matched above"),
                }
                .to_string(),
                "instruction",
                json!({"trace_line": line}),
            ),
        };
        let slice = |name: &str, category: &str, ts: f64, dur: f64, args: serde_json::Value| {
            json!({"name": name, "cat": category, "ph": "X", "ts": ts, "dur": dur,
                   "pid": 1, "tid": 1, "args": args})
        };
        let mut args = args;
        args["event_index"] = json!(index);
        args["rematerialized_compute"] = json!(remat);
        self.events
            .push(slice(&name, category, start, spent as f64, args));
        if remat > 0
            || new_events
                .iter()
                .any(|e| matches!(e, Event::Rematerialize { .. }))
        {
            let count = new_events
                .iter()
                .filter(|e| matches!(e, Event::Rematerialize { .. }))
                .count();
            self.events.push(slice(
                "rematerialization",
                "remat",
                start,
                remat as f64,
                json!({"recomputed_ops": count, "compute": remat, "for": name}),
            ));
        }
        // Instants inside the slice, in the order they happened, spread
        // evenly over it (the log keeps their order, not their times).
        let step = if new_events.is_empty() {
            0.0
        } else {
            spent as f64 / new_events.len() as f64
        };
        for (k, logged) in new_events.iter().enumerate() {
            let ts = start + step * k as f64;
            self.events.push(match logged {
                Event::Evict {
                    tensor,
                    bytes,
                    eager,
                    score,
                } => json!({"name": "evict", "cat": "evict", "ph": "i", "s": "t", "ts": ts,
                    "pid": 1, "tid": 1,
                    "args": {"bytes": bytes, "tensor": format!("{tensor:?}"), "eager": eager,
                             "score": score.filter(|s| s.is_finite()), "during": name}}),
                Event::Rematerialize { tensor, op } => {
                    json!({"name": format!("recompute {op}"), "cat": "remat", "ph": "i",
                    "s": "t", "ts": ts, "pid": 1, "tid": 1,
                    "args": {"op": op, "tensor": format!("{tensor:?}"), "during": name}})
                }
            });
        }
        let mut counters = json!({"in_use_bytes": memory.in_use_bytes});
        if let Some(budget) = memory.budget_bytes {
            counters["budget_bytes"] = json!(budget);
        }
        self.events.push(
            json!({"name": "memory", "ph": "C", "ts": start + spent as f64,
            "pid": 1, "args": counters}),
        );
        if let Some(arena) = memory.arena {
            self.events.push(json!({"name": "fragmentation", "ph": "C",
                "ts": start + spent as f64, "pid": 1,
                "args": {"fragmentation": arena.fragmentation}}));
        }
        self.logged = dtr.events().len();
        self.compute = stats.compute;
        self.remat_compute = stats.remat_compute;
    }

    /// The trace as JSON, with `about` (the run's settings) as its metadata.
    pub fn to_json(&self, about: serde_json::Value) -> String {
        let mut events = vec![
            serde_json::json!({"name": "process_name", "ph": "M", "pid": 1,
                "args": {"name": "dtr replay"}}),
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": 1,
                "args": {"name": "trace events (1 µs = 1 cost unit)"}}),
        ];
        events.extend(self.events.iter().cloned());
        serde_json::json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": about,
        })
        .to_string()
    }

    /// Events written so far (slices, instants and counters).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// A stretch of a trace's events: forward, backward, or what follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// `forward`, `backward`, `after backward` or `after backward (optimizer)`.
    pub name: String,
    /// First trace event (an index: the timeline's clock).
    pub start: usize,
    /// Last trace event, inclusive.
    pub end: usize,
}

/// The phases of a training step, told from its op names: the forward pass
/// up to the first op whose name has `backward` in it (as autograd's ops
/// do: `aten.convolution_backward.default`, `relu_backward`), the backward
/// pass to the last such op, and what follows it (the optimizer step, when
/// it has ops; else releases and reads).
/// Empty for a trace without such ops: nothing can be told apart.
pub fn phases(trace: &crate::trace::Trace) -> Vec<Phase> {
    use crate::trace::TraceEvent;
    let backward = |event: &TraceEvent| matches!(event, TraceEvent::Apply(apply) if apply.op.to_ascii_lowercase().contains("backward"));
    let (Some(first), Some(last)) = (
        trace.events.iter().position(backward),
        trace.events.iter().rposition(backward),
    ) else {
        return Vec::new();
    };
    let end = trace.events.len().saturating_sub(1);
    let mut phases = Vec::new();
    if first > 0 {
        phases.push(Phase {
            name: "forward".into(),
            start: 0,
            end: first - 1,
        });
    }
    phases.push(Phase {
        name: "backward".into(),
        start: first,
        end: last,
    });
    if last < end {
        let applies_after = trace.events[last + 1..]
            .iter()
            .any(|e| matches!(e, TraceEvent::Apply { .. }));
        phases.push(Phase {
            name: if applies_after {
                "after backward (optimizer)"
            } else {
                "after backward"
            }
            .into(),
            start: last + 1,
            end,
        });
    }
    phases
}

/// A note for the highest sample: its size, and the trace line and op of
/// the event that reached it.
pub fn peak_note(trace: &crate::trace::Trace, timeline: &Timeline) -> Option<String> {
    use crate::trace::TraceEvent;
    let peak = timeline.samples.iter().max_by_key(|s| s.in_use_bytes)?;
    let what = match trace.events.get(peak.clock)? {
        TraceEvent::Apply(apply) => match &apply.module {
            Some(module) => format!("`{}` in {module}", apply.op),
            None => format!("`{}`", apply.op),
        },
        TraceEvent::Put { .. } => "a put".into(),
        _ => "an instruction".into(),
    };
    Some(format!(
        "peak {} after line {}: {what}",
        bytesize::ByteSize::b(peak.in_use_bytes).display().iec(),
        trace.lines.get(peak.clock).copied().unwrap_or(0)
    ))
}
