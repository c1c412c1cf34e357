//! Pictures of sweep results, as SVG: per trace, overhead against the
//! budget ratio with one line per policy, thrashing runs as crosses and
//! out-of-memory runs as triangles where they stopped (the shape of the DTR
//! paper's Figure 2); and across traces, the smallest ratio each policy
//! completes at; and one replay's memory over its logical clock.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::chains::ChainRow;
use super::timeline::{Sample, Timeline};
use super::Row;
use crate::error::{Error, Result};
use crate::memory::MemoryModel;
use crate::policy::Sampling;
use crate::trace::replay::ReplayStatus;

fn plot_error(path: &Path, error: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("drawing {}: {error}", path.display()))
}

/// The policy a row belongs to, as its legend names it.
fn policy(row: &Row) -> String {
    let mut name = row.heuristic.clone();
    if row.memory != MemoryModel::Counter {
        name += &format!(" / {}", row.memory);
    }
    if row.sampling != Sampling::All {
        name += &format!(" / {}", row.sampling);
    }
    if row.seed != 0 {
        name += &format!(" / seed {}", row.seed);
    }
    name
}

/// A short name for a trace path: the file name up to its first `-` or `.`.
pub fn short_name(trace: &str) -> String {
    let file = Path::new(trace)
        .file_name()
        .map_or(trace.into(), |f| f.to_string_lossy().to_string());
    file.split(['-', '.']).next().unwrap_or(&file).to_string()
}

/// Distinct values in first-seen order.
fn distinct(values: impl Iterator<Item = String>) -> Vec<String> {
    let mut seen = Vec::new();
    for v in values {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen
}

type Chart<'a> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A white canvas of `size` pixels that draws to `path`.
fn canvas(path: &Path, size: (u32, u32)) -> Result<Area<'_>> {
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
    Ok(root)
}

/// Axes over `x` × `y` on `area` with the shared margins; no caption when
/// `caption` is empty.
fn axes<'a>(
    area: &Area<'a>,
    caption: &str,
    x: std::ops::Range<f64>,
    y: std::ops::Range<f64>,
    path: &Path,
) -> Result<Chart<'a>> {
    let mut builder = ChartBuilder::on(area);
    if !caption.is_empty() {
        builder.caption(caption, ("sans-serif", 20));
    }
    builder
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d(x, y)
        .map_err(|e| plot_error(path, e))
}

/// One policy's points joined by a line, with dots, named in the legend.
fn labelled_line(
    chart: &mut Chart<'_>,
    points: &[(f64, f64)],
    color: RGBAColor,
    label: String,
    path: &Path,
) -> Result<()> {
    chart
        .draw_series(LineSeries::new(points.to_vec(), color.stroke_width(2)))
        .map_err(|e| plot_error(path, e))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
        .map_err(|e| plot_error(path, e))?;
    Ok(())
}

/// Draws the legend in the upper right.
fn legend(chart: &mut Chart<'_>, path: &Path) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| plot_error(path, e))
}

/// Draws the legend and writes the file.
fn finish(chart: &mut Chart<'_>, root: &Area<'_>, path: &Path) -> Result<()> {
    legend(chart, path)?;
    root.present().map_err(|e| plot_error(path, e))
}

/// Overhead vs ratio for one trace: completed runs joined by lines, thrash
/// and out-of-memory runs as crosses at the overhead where they stopped.
pub fn overhead_chart(rows: &[Row], trace: &str, path: &Path) -> Result<()> {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.trace == trace).collect();
    let policies = distinct(rows.iter().map(|r| policy(r)));
    let top = rows
        .iter()
        .map(|r| r.overhead)
        .fold(2.0f64, f64::max)
        .min(10.0)
        * 1.05;
    // Static checkpointing may need more than the unbounded peak.
    let right = rows.iter().map(|r| r.ratio).fold(1.0f64, f64::max) * 1.05;
    let root = canvas(path, (900, 560))?;
    let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
    let caption = format!(
        "{}: overhead vs memory budget (× thrash, ▲ out of memory)",
        short_name(trace)
    );
    let mut chart = axes(&root, &caption, 0.0..right, 1.0..top, path)?;
    chart
        .configure_mesh()
        .x_desc("budget / unbounded peak")
        .y_desc("compute overhead (× unbounded)")
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, name) in policies.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if name == super::STATIC_CHECKPOINTING {
            // One point: the peak it needs and what it costs.
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| policy(r) == *name && r.status == ReplayStatus::Ok)
                .map(|r| (r.ratio, r.overhead.min(top)))
                .collect();
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|&p| Circle::new(p, 8, color.stroke_width(3))),
                )
                .map_err(|e| draw(&e))?
                .label(format!("{name} (Chen et al., √N checkpoints)"))
                .legend(move |(x, y)| Circle::new((x + 8, y), 6, color.stroke_width(3)));
            continue;
        }
        let mut ok: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| policy(r) == *name && r.status == ReplayStatus::Ok)
            .map(|r| (r.ratio, r.overhead.min(top)))
            .collect();
        ok.sort_by(|a, b| a.0.total_cmp(&b.0));
        labelled_line(&mut chart, &ok, color, name.clone(), path)?;
        let stopped = |status: ReplayStatus| {
            rows.iter()
                .filter(move |r| policy(r) == *name && r.status == status)
                .map(move |r| (r.ratio, r.overhead.clamp(1.0, top)))
        };
        chart
            .draw_series(
                stopped(ReplayStatus::Thrash).map(|p| Cross::new(p, 5, color.stroke_width(2))),
            )
            .map_err(|e| draw(&e))?;
        chart
            .draw_series(
                stopped(ReplayStatus::OutOfMemory)
                    .map(|p| TriangleMarker::new(p, 5, color.filled())),
            )
            .map_err(|e| draw(&e))?;
    }
    finish(&mut chart, &root, path)
}

/// Across traces, the smallest ratio each policy completes at (lower is better).
pub fn comparison_chart(rows: &[Row], path: &Path) -> Result<()> {
    let traces = distinct(rows.iter().map(|r| r.trace.clone()));
    let policies = distinct(rows.iter().map(policy));
    let names: Vec<String> = traces.iter().map(|t| short_name(t)).collect();
    let top = rows.iter().map(|r| r.ratio * 1.1).fold(1.45f64, f64::max);
    let root = canvas(path, (900, 560))?;
    let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
    // Headroom above 1.0 keeps the legend clear of the points; static
    // checkpointing may need more than the unbounded peak.
    let mut chart = axes(
        &root,
        "smallest budget that completes, by policy",
        -0.5..traces.len() as f64 - 0.5,
        0.0..top,
        path,
    )?;
    chart
        .configure_mesh()
        .x_labels(traces.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("budget / unbounded peak")
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, name) in policies.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let offset = (i as f64 - policies.len() as f64 / 2.0) * 0.03;
        let points: Vec<(f64, f64)> = traces
            .iter()
            .enumerate()
            .filter_map(|(t, trace)| {
                rows.iter()
                    .filter(|r| {
                        r.trace == *trace && policy(r) == *name && r.status == ReplayStatus::Ok
                    })
                    .map(|r| r.ratio)
                    .min_by(f64::total_cmp)
                    .map(|ratio| (t as f64 + offset, ratio))
            })
            .collect();
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))
            .map_err(|e| draw(&e))?
            .label(name.clone())
            .legend(move |(x, y)| Circle::new((x + 8, y), 5, color.filled()));
    }
    finish(&mut chart, &root, path)
}

/// Every chart for a sweep's rows: one per trace, and the comparison.
pub fn plot_all(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| plot_error(dir, e))?;
    let mut written = Vec::new();
    for trace in distinct(rows.iter().map(|r| r.trace.clone())) {
        let path = dir.join(format!("overhead-{}.svg", short_name(&trace)));
        overhead_chart(rows, &trace, &path)?;
        written.push(path);
    }
    let path = dir.join("policies.svg");
    comparison_chart(rows, &path)?;
    written.push(path);
    Ok(written)
}

/// Memory in use over the logical clock of one replay, with the budget as a
/// dashed line, evictions (red) and rematerialisations (blue) as ticks along
/// the bottom, and in arena mode the fragmentation in a panel below.
pub fn timeline_chart(timeline: &Timeline, title: &str, path: &Path) -> Result<()> {
    const MIB: f64 = (1u64 << 20) as f64;
    let samples = timeline.downsampled(1500);
    let end = samples.last().map_or(1, |s| s.clock + 1) as f64;
    let budget = timeline.budget_bytes.map(|b| b as f64 / MIB);
    let top = samples
        .iter()
        .map(|s| s.in_use_bytes as f64 / MIB)
        .chain(budget)
        .fold(1e-6f64, f64::max)
        * 1.1;
    let arena = samples.iter().any(|s| s.fragmentation.is_some());
    let root = canvas(path, (1000, if arena { 680 } else { 520 }))?;
    let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
    let (upper, lower) = root.split_vertically(if arena { 500 } else { 520 });
    let mut chart = axes(&upper, title, 0.0..end, 0.0..top, path)?;
    chart
        .configure_mesh()
        .x_desc("trace event (logical clock)")
        .y_desc("memory in use (MiB)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|e| draw(&e))?;
    let memory = BLACK.stroke_width(1);
    chart
        .draw_series(LineSeries::new(
            samples
                .iter()
                .map(|s| (s.clock as f64, s.in_use_bytes as f64 / MIB)),
            memory,
        ))
        .map_err(|e| draw(&e))?
        .label("in use")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], memory));
    if let Some(budget) = budget {
        let line = RED.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, budget), (end, budget)],
                8,
                5,
                line,
            ))
            .map_err(|e| draw(&e))?
            .label("budget")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], line));
    }
    // Ticks along the bottom: evictions in the lowest band, rematerialisations above.
    let band = top * 0.04;
    let ticks = |lift: f64, count: fn(&Sample) -> u64, color: RGBColor| {
        samples.iter().filter(move |s| count(s) > 0).map(move |s| {
            let x = s.clock as f64;
            PathElement::new(vec![(x, lift), (x, lift + band)], color.stroke_width(1))
        })
    };
    let evict = RGBColor(200, 30, 30);
    let remat = RGBColor(30, 80, 200);
    chart
        .draw_series(ticks(0.0, |s| s.evictions, evict))
        .map_err(|e| draw(&e))?
        .label("evictions")
        .legend(move |(x, y)| PathElement::new(vec![(x + 9, y - 6), (x + 9, y + 6)], evict));
    chart
        .draw_series(ticks(band * 1.2, |s| s.rematerializations, remat))
        .map_err(|e| draw(&e))?
        .label("rematerialisations")
        .legend(move |(x, y)| PathElement::new(vec![(x + 9, y - 6), (x + 9, y + 6)], remat));
    legend(&mut chart, path)?;
    if arena {
        let mut panel = axes(&lower, "", 0.0..end, 0.0..1.0, path)?;
        panel
            .configure_mesh()
            .y_desc("fragmentation")
            .y_labels(3)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(|e| draw(&e))?;
        panel
            .draw_series(LineSeries::new(
                samples
                    .iter()
                    .filter_map(|s| Some((s.clock as f64, s.fragmentation?))),
                RGBColor(120, 60, 160).stroke_width(1),
            ))
            .map_err(|e| draw(&e))?;
    }
    root.present().map_err(|e| plot_error(path, e))
}

/// The Theorem 3.1 experiment: overhead against chain length (log scale)
/// at a budget of ⌈2√N⌉ activations, one line per policy.
pub fn chains_chart(rows: &[ChainRow], path: &Path) -> Result<()> {
    let policies = distinct(rows.iter().map(|r| r.policy.clone()));
    let log = |n: usize| (n.max(1) as f64).log10();
    let (left, right) = rows.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| {
        (lo.min(log(r.length)), hi.max(log(r.length)))
    });
    let (left, right) = if left <= right {
        (left - 0.1, right + 0.1)
    } else {
        (1.0, 2.0)
    };
    let top = rows
        .iter()
        .map(|r| r.overhead)
        .fold(2.0f64, f64::max)
        .min(10.0)
        * 1.1;
    let root = canvas(path, (900, 560))?;
    let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
    let mut chart = axes(
        &root,
        "uniform chains under ⌈2√N⌉ activations: overhead stays O(1)",
        left..right,
        1.0..top,
        path,
    )?;
    chart
        .configure_mesh()
        .x_desc("chain length N (layers)")
        .y_desc("compute overhead (× unbounded)")
        .x_label_formatter(&|x| format!("{:.0}", 10f64.powf(*x)))
        .draw()
        .map_err(|e| draw(&e))?;
    for (i, name) in policies.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.policy == *name && r.status == ReplayStatus::Ok)
            .map(|r| (log(r.length), r.overhead.min(top)))
            .collect();
        let label = match name.as_str() {
            super::chains::REVOLVE => "revolve (optimal, same memory)".to_string(),
            super::STATIC_CHECKPOINTING => {
                format!("{name} (Chen et al., no budget; peak in the CSV)")
            }
            _ => name.clone(),
        };
        labelled_line(&mut chart, &points, color, label, path)?;
        chart
            .draw_series(
                rows.iter()
                    .filter(|r| r.policy == *name && r.status != ReplayStatus::Ok)
                    .map(|r| {
                        Cross::new(
                            (log(r.length), r.overhead.min(top)),
                            5,
                            color.stroke_width(2),
                        )
                    }),
            )
            .map_err(|e| draw(&e))?;
    }
    finish(&mut chart, &root, path)
}
