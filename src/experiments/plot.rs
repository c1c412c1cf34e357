//! Pictures of sweep results, as SVG and, beside each, PNG: per trace, overhead against the
//! budget ratio with one line per policy and the runs that stopped (out of
//! memory, thrashing) as their own markers where they stopped (the shape
//! of the DTR paper's Figure 2); across traces, the smallest ratio each
//! policy completes at; one replay's memory over its logical clock; and the
//! chains experiment.
//!
//! Every chart uses the Okabe–Ito colour-blind-safe palette with a marker
//! shape per series (so series stay apart in greyscale), keeps its legend
//! beside the data rather than on it, and is written whole or not at all.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::chains::ChainRow;
use super::raster::{encode_png, register_font, Tee};
use super::timeline::{Phase, Sample, Timeline};
use super::Placement;
use super::Row;
use crate::config::RestoreMode;
use crate::error::{Error, Result};
use crate::memory::MemoryModel;
use crate::policy::Sampling;
use crate::trace::replay::ReplayStatus;

fn plot_error(path: &Path, error: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("drawing {}: {error}", path.display()))
}

/// Okabe & Ito's colour-blind-safe palette, yellow last (faint on white).
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(230, 159, 0),   // orange
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(0, 0, 0),       // black
    RGBColor(240, 228, 66),  // yellow
];

/// The grey of markers that stand for a status, not a series.
const GREY: RGBColor = RGBColor(90, 90, 90);

/// A marker's outline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Circle,
    Square,
    Triangle,
    Diamond,
    Plus,
    /// Kept for runs that stopped out of memory.
    InvertedTriangle,
    /// Kept for runs that stopped thrashing.
    Cross,
}

/// The shapes series take, in turn (the stopped runs' two are kept apart).
const SERIES_SHAPES: [Shape; 5] = [
    Shape::Circle,
    Shape::Square,
    Shape::Triangle,
    Shape::Diamond,
    Shape::Plus,
];

/// How series `i` is drawn: colour, shape, and filled or hollow, distinct
/// for the first 40 series.
#[derive(Debug, Clone, Copy)]
struct Look {
    color: RGBColor,
    shape: Shape,
    filled: bool,
}

fn look(i: usize) -> Look {
    Look {
        color: PALETTE[i % PALETTE.len()],
        shape: SERIES_SHAPES[i % SERIES_SHAPES.len()],
        filled: (i / SERIES_SHAPES.len()).is_multiple_of(2),
    }
}

/// A marker's outline as pixel offsets (the shapes drawn as polygons),
/// or its two strokes (the shapes drawn as lines).
enum Outline {
    Round,
    Polygon(Vec<(i32, i32)>),
    Strokes(Vec<(i32, i32)>, Vec<(i32, i32)>),
}

fn outline(shape: Shape, r: i32) -> Outline {
    match shape {
        Shape::Circle => Outline::Round,
        Shape::Square => Outline::Polygon(vec![(-r, -r), (r, -r), (r, r), (-r, r)]),
        Shape::Triangle => Outline::Polygon(vec![(0, -r - 1), (r + 1, r), (-r - 1, r)]),
        Shape::InvertedTriangle => Outline::Polygon(vec![(0, r + 1), (r + 1, -r), (-r - 1, -r)]),
        Shape::Diamond => Outline::Polygon(vec![(0, -r - 2), (r + 1, 0), (0, r + 2), (-r - 1, 0)]),
        Shape::Plus => {
            Outline::Strokes(vec![(-r - 1, 0), (r + 1, 0)], vec![(0, -r - 1), (0, r + 1)])
        }
        Shape::Cross => Outline::Strokes(vec![(-r, -r), (r, r)], vec![(-r, r), (r, -r)]),
    }
}

/// Draws a marker of `shape` (`r` pixels in radius) at each of `points`.
fn markers(
    chart: &mut Chart<'_>,
    points: impl Iterator<Item = (f64, f64)>,
    (shape, r): (Shape, i32),
    color: RGBColor,
    filled: bool,
    path: &Path,
) -> Result<()> {
    let style = if filled {
        color.filled()
    } else {
        color.stroke_width(2)
    };
    let pen = color.stroke_width(2);
    let drawn = match outline(shape, r) {
        Outline::Round => chart
            .draw_series(points.map(|p| EmptyElement::at(p) + Circle::new((0, 0), r, style)))
            .map(|_| ()),
        Outline::Polygon(corners) if filled => chart
            .draw_series(points.map(|p| EmptyElement::at(p) + Polygon::new(corners.clone(), style)))
            .map(|_| ()),
        Outline::Polygon(mut corners) => {
            corners.push(corners[0]);
            chart
                .draw_series(
                    points.map(|p| EmptyElement::at(p) + PathElement::new(corners.clone(), pen)),
                )
                .map(|_| ())
        }
        Outline::Strokes(a, b) => chart
            .draw_series(points.map(|p| {
                EmptyElement::at(p)
                    + PathElement::new(a.clone(), pen)
                    + PathElement::new(b.clone(), pen)
            }))
            .map(|_| ()),
    };
    drawn.map_err(|e| plot_error(path, e))
}

/// Draws one marker at pixel `at` of a legend's area.
fn legend_marker(
    area: &Area<'_>,
    at: (i32, i32),
    (shape, filled): (Shape, bool),
    color: RGBColor,
    path: &Path,
) -> Result<()> {
    let r = 5;
    let style = if filled {
        color.filled()
    } else {
        color.stroke_width(2)
    };
    let pen = color.stroke_width(2);
    let drawn = match outline(shape, r) {
        Outline::Round => area.draw(&(EmptyElement::at(at) + Circle::new((0, 0), r, style))),
        Outline::Polygon(corners) if filled => {
            area.draw(&(EmptyElement::at(at) + Polygon::new(corners, style)))
        }
        Outline::Polygon(mut corners) => {
            corners.push(corners[0]);
            area.draw(&(EmptyElement::at(at) + PathElement::new(corners, pen)))
        }
        Outline::Strokes(a, b) => {
            area.draw(&(EmptyElement::at(at) + PathElement::new(a, pen) + PathElement::new(b, pen)))
        }
    };
    drawn.map_err(|e| plot_error(path, e))
}

/// One line of a legend.
struct Entry {
    label: String,
    color: RGBColor,
    /// A marker, if the series has one.
    shape: Option<(Shape, bool)>,
    line: Stroke,
}

#[derive(Clone, Copy, PartialEq)]
enum Stroke {
    None,
    Solid,
    Dashed,
    /// A short vertical tick, as event marks are drawn.
    Tick,
}

impl Entry {
    fn series(label: String, look: Look, line: Stroke) -> Entry {
        Entry {
            label,
            color: look.color,
            shape: Some((look.shape, look.filled)),
            line,
        }
    }

    fn line(label: &str, color: RGBColor, line: Stroke) -> Entry {
        Entry {
            label: label.into(),
            color,
            shape: None,
            line,
        }
    }
}

/// Font sizes that stay readable when a chart is printed small.
const CAPTION: u32 = 22;
const LABELS: u32 = 16;
const DESCRIPTIONS: u32 = 17;
const LEGEND: u32 = 15;

/// Draws a legend down `area` (beside the chart, never on its data).
fn draw_legend(area: &Area<'_>, title: &str, entries: &[Entry], path: &Path) -> Result<()> {
    let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
    let font = ("sans-serif", LEGEND).into_font();
    let mut y = 48;
    if !title.is_empty() {
        area.draw(&Text::new(
            title.to_string(),
            (10, 18),
            ("sans-serif", LEGEND + 1)
                .into_font()
                .style(FontStyle::Bold),
        ))
        .map_err(|e| draw(&e))?;
    }
    for entry in entries {
        let pen = entry.color.stroke_width(2);
        match entry.line {
            Stroke::None => {}
            Stroke::Solid => area
                .draw(&PathElement::new(vec![(10, y), (42, y)], pen))
                .map_err(|e| draw(&e))?,
            Stroke::Dashed => {
                for x in [10, 24, 38] {
                    area.draw(&PathElement::new(vec![(x, y), (x + 8, y)], pen))
                        .map_err(|e| draw(&e))?;
                }
            }
            Stroke::Tick => area
                .draw(&PathElement::new(vec![(26, y - 8), (26, y + 8)], pen))
                .map_err(|e| draw(&e))?,
        }
        if let Some(shape) = entry.shape {
            legend_marker(area, (26, y), shape, entry.color, path)?;
        }
        // Long labels wrap at a space rather than run off the canvas.
        let mut line = String::new();
        let mut lines = Vec::new();
        for word in entry.label.split(' ') {
            if !line.is_empty() && line.chars().count() + word.chars().count() > 30 {
                lines.push(std::mem::take(&mut line));
            }
            if !line.is_empty() {
                line.push(' ');
            }
            line += word;
        }
        lines.push(line);
        for (k, text) in lines.iter().enumerate() {
            area.draw(&Text::new(
                text.clone(),
                (50, y - 8 + 18 * k as i32),
                font.clone(),
            ))
            .map_err(|e| draw(&e))?;
        }
        y += 10 + 18 * lines.len() as i32;
    }
    Ok(())
}

/// The policy a row belongs to, as its legend names it.
fn policy(row: &Row) -> String {
    let mut name = row.heuristic.clone();
    if row.memory != Placement::Dynamic(MemoryModel::Counter) {
        name += &format!(" / {}", row.memory);
    }
    if row.restore != RestoreMode::Drop {
        name += &format!(" / {}", row.restore);
    }
    if row.sampling != Sampling::All {
        name += &format!(" / {}", row.sampling);
    }
    if row.seed != 0 {
        name += &format!(" / seed {}", row.seed);
    }
    name
}

/// A row's overhead: what the run cost, or where it stopped.
fn overhead_of(row: &Row) -> f64 {
    row.overhead.or(row.overhead_at_stop).unwrap_or(1.0)
}

/// A short name for a trace path: its file name without the extension.
pub fn short_name(trace: &str) -> String {
    trace_labels(&[trace.to_string()]).remove(0)
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

type Chart<'a> = ChartContext<'a, Tee<'a>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

type Area<'a> = DrawingArea<Tee<'a>, Shift>;

/// Width of the legend panel right of a chart.
const LEGEND_WIDTH: u32 = 320;

/// Draws on a white canvas of `size` pixels and writes it to `path` as
/// SVG and beside it, with the same stem, as PNG ([`png_path`]): both
/// whole or neither (each written aside, then both renamed into place).
fn render(path: &Path, size: (u32, u32), draw: impl FnOnce(&Area<'_>) -> Result<()>) -> Result<()> {
    let png_path = png_path(path);
    if png_path == path {
        return Err(Error::file(path, "a chart's path must end in .svg"));
    }
    register_font()?;
    let mut svg = String::new();
    let mut pixels = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = Tee::new(&mut svg, &mut pixels, size)?.into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_error(path, e))?;
        draw(&root)?;
        root.present().map_err(|e| plot_error(path, e))?;
    }
    let png = encode_png(&pixels, size)?;
    let svg_aside = super::write_aside(path, svg.as_bytes())?;
    let png_aside = super::write_aside(&png_path, &png)?;
    svg_aside.persist(path).map_err(|e| Error::file(path, e))?;
    png_aside
        .persist(&png_path)
        .map_err(|e| Error::file(&png_path, e))?;
    Ok(())
}

/// Where the PNG of a chart written to `svg` goes: beside it, with the
/// same stem (`overhead-x.svg` → `overhead-x.png`).
pub fn png_path(svg: &Path) -> PathBuf {
    svg.with_extension("png")
}

/// The chart's area and, right of it, the legend's.
fn with_legend<'a>(root: &Area<'a>) -> (Area<'a>, Area<'a>) {
    let width = root.dim_in_pixel().0;
    root.split_horizontally(width.saturating_sub(LEGEND_WIDTH))
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
        builder.caption(caption, ("sans-serif", CAPTION));
    }
    builder
        .margin(14)
        .x_label_area_size(55)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(|e| plot_error(path, e))
}

/// The mesh with readable labels; `x` and `y` describe the axes.
fn mesh(chart: &mut Chart<'_>, x: &str, y: &str, path: &Path) -> Result<()> {
    chart
        .configure_mesh()
        .x_desc(x)
        .y_desc(y)
        .label_style(("sans-serif", LABELS))
        .axis_desc_style(("sans-serif", DESCRIPTIONS))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(|e| plot_error(path, e))
}

/// One series' points joined by a line, each with its marker.
fn marked_line(
    chart: &mut Chart<'_>,
    points: &[(f64, f64)],
    look: Look,
    path: &Path,
) -> Result<()> {
    chart
        .draw_series(LineSeries::new(points.to_vec(), look.color.stroke_width(2)))
        .map_err(|e| plot_error(path, e))?;
    markers(
        chart,
        points.iter().copied(),
        (look.shape, 5),
        look.color,
        look.filled,
        path,
    )
}

/// The legend entries for runs that stopped, those that occur.
fn stopped_entries(rows: &[&Row]) -> Vec<Entry> {
    let mut entries = Vec::new();
    for (status, shape, label) in [
        (
            ReplayStatus::OutOfMemory,
            Shape::InvertedTriangle,
            "stopped: out of memory (at the overhead it had reached)",
        ),
        (
            ReplayStatus::Thrash,
            Shape::Cross,
            "stopped: thrashing (past the compute limit)",
        ),
    ] {
        if rows.iter().any(|r| r.status == status) {
            entries.push(Entry {
                label: label.into(),
                color: GREY,
                shape: Some((shape, false)),
                line: Stroke::None,
            });
        }
    }
    entries
}

/// Overhead vs ratio for one trace: completed runs joined by lines, and
/// runs that stopped (out of memory, thrashing) as their own markers at the
/// ratio they ran and the overhead they had reached when they stopped.
pub fn overhead_chart(rows: &[Row], trace: &str, path: &Path) -> Result<()> {
    let traces = distinct(rows.iter().map(|r| r.trace.clone()));
    let label = traces
        .iter()
        .position(|t| t == trace)
        .map_or_else(|| short_name(trace), |i| trace_labels(&traces).remove(i));
    let rows: Vec<&Row> = rows.iter().filter(|r| r.trace == trace).collect();
    let policies = distinct(rows.iter().map(|r| policy(r)));
    let top = rows
        .iter()
        .map(|r| overhead_of(r))
        .fold(2.0f64, f64::max)
        .min(10.0)
        * 1.05;
    // Runs that stopped early may have done less than the unbounded run's
    // compute: the axis starts at 0 to show them where they are.
    let bottom = if rows.iter().any(|r| overhead_of(r) < 1.0) {
        0.0
    } else {
        1.0
    };
    // Static checkpointing may need more than the unbounded peak.
    let right = rows.iter().map(|r| r.ratio).fold(1.0f64, f64::max) * 1.05;
    render(path, (1100, 600), |root| {
        let (left, side) = with_legend(root);
        let caption = format!("{label}: compute overhead vs memory budget");
        let mut chart = axes(&left, &caption, 0.0..right, bottom..top, path)?;
        mesh(
            &mut chart,
            "memory budget (fraction of the unbounded run's peak)",
            "compute overhead (× the unbounded run's)",
            path,
        )?;
        let mut entries = Vec::new();
        for (i, name) in policies.iter().enumerate() {
            let look = look(i);
            let of = |status: Option<ReplayStatus>| {
                rows.iter()
                    .filter(move |r| {
                        policy(r) == *name && status.is_none_or(|status| r.status == status)
                    })
                    .map(|r| (r.ratio, overhead_of(r).clamp(bottom, top)))
            };
            if name == super::STATIC_CHECKPOINTING {
                // One point: the peak it needs and what it costs.
                markers(
                    &mut chart,
                    of(Some(ReplayStatus::Ok)),
                    (look.shape, 8),
                    look.color,
                    look.filled,
                    path,
                )?;
                entries.push(Entry::series(
                    format!("{name} (Chen et al., √N checkpoints; no budget)"),
                    look,
                    Stroke::None,
                ));
                continue;
            }
            let mut ok: Vec<(f64, f64)> = of(Some(ReplayStatus::Ok)).collect();
            ok.sort_by(|a, b| a.0.total_cmp(&b.0));
            marked_line(&mut chart, &ok, look, path)?;
            for (status, shape) in [
                (ReplayStatus::OutOfMemory, Shape::InvertedTriangle),
                (ReplayStatus::Thrash, Shape::Cross),
            ] {
                markers(
                    &mut chart,
                    of(Some(status)),
                    (shape, 6),
                    look.color,
                    false,
                    path,
                )?;
            }
            entries.push(Entry::series(name.clone(), look, Stroke::Solid));
        }
        entries.extend(stopped_entries(&rows));
        draw_legend(&side, "policy", &entries, path)
    })
}

/// Across traces, the smallest ratio each policy completes at (lower is better).
pub fn comparison_chart(rows: &[Row], path: &Path) -> Result<()> {
    let traces = distinct(rows.iter().map(|r| r.trace.clone()));
    let policies = distinct(rows.iter().map(policy));
    let names = trace_labels(&traces);
    let top = rows.iter().map(|r| r.ratio * 1.1).fold(1.1f64, f64::max);
    render(path, (1100, 600), |root| {
        let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
        let (left, side) = with_legend(root);
        let mut chart = axes(
            &left,
            "smallest budget that completes, by policy (lower is better)",
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
            .y_desc("budget (fraction of the unbounded run's peak)")
            .label_style(("sans-serif", LABELS))
            .axis_desc_style(("sans-serif", DESCRIPTIONS))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| draw(&e))?;
        let mut entries = Vec::new();
        for (i, name) in policies.iter().enumerate() {
            let look = look(i);
            let offset = (i as f64 - (policies.len() as f64 - 1.0) / 2.0) * 0.07;
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
            markers(
                &mut chart,
                points.iter().copied(),
                (look.shape, 6),
                look.color,
                look.filled,
                path,
            )?;
            entries.push(Entry::series(name.clone(), look, Stroke::None));
        }
        draw_legend(&side, "policy", &entries, path)
    })
}

/// A short name per trace path, distinct for distinct paths: the file
/// name without its extension, cut before a `-` or `.` where that keeps it
/// apart from the others (`resnet32-56-….log` is `resnet32`, but
/// `resnet-small` and `resnet-large` keep their suffixes), with parent
/// directories added where file names alone clash (`a/x.jsonl` and
/// `b/x.jsonl`: `a-x`, `b-x`).
pub fn trace_labels(traces: &[String]) -> Vec<String> {
    /// A name's pieces: its stem cut before each `-` or `.`, then its
    /// directories, innermost first.
    struct Name {
        pieces: Vec<String>,
        dirs: Vec<String>,
    }
    let names: Vec<Name> = traces
        .iter()
        .map(|t| {
            let path = Path::new(t);
            let stem = path
                .file_stem()
                .map_or(t.clone(), |s| s.to_string_lossy().into_owned());
            let mut pieces = Vec::new();
            let mut piece = String::new();
            for c in stem.chars() {
                if (c == '-' || c == '.') && !piece.is_empty() {
                    pieces.push(std::mem::take(&mut piece));
                }
                piece.push(c);
            }
            pieces.push(piece);
            let dirs = path
                .parent()
                .into_iter()
                .flat_map(|p| p.components().rev())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .filter(|c| !c.is_empty() && c != "/" && c != "." && c != "..")
                .collect();
            Name { pieces, dirs }
        })
        .collect();
    // A name at `depth`: that many stem pieces, then directories.
    let label = |name: &Name, depth: usize| {
        let k = depth.min(name.pieces.len());
        let d = depth.saturating_sub(name.pieces.len()).min(name.dirs.len());
        let stem = name.pieces[..k].concat();
        let dirs: Vec<&str> = name.dirs[..d].iter().rev().map(String::as_str).collect();
        if dirs.is_empty() {
            stem
        } else {
            format!("{}-{stem}", dirs.join("-"))
        }
    };
    let mut depth = vec![1; names.len()];
    let mut labels: Vec<String> = names.iter().map(|n| label(n, 1)).collect();
    loop {
        let clashing: Vec<usize> = (0..labels.len())
            .filter(|&i| (0..labels.len()).any(|j| j != i && labels[j] == labels[i]))
            .collect();
        // Longer stems first; directories only where no stem of the clash can grow.
        let in_stem: Vec<usize> = clashing
            .iter()
            .copied()
            .filter(|&i| depth[i] < names[i].pieces.len())
            .collect();
        let grow: Vec<usize> = if in_stem.is_empty() {
            clashing
                .into_iter()
                .filter(|&i| depth[i] < names[i].pieces.len() + names[i].dirs.len())
                .collect()
        } else {
            in_stem
        };
        if grow.is_empty() {
            break;
        }
        for i in grow {
            depth[i] += 1;
            labels[i] = label(&names[i], depth[i]);
        }
    }
    // Paths that differ only in ways a name cannot show: numbered.
    for i in 0..labels.len() {
        if (0..i).any(|j| labels[j] == labels[i]) {
            labels[i] = format!("{}-{}", labels[i], i + 1);
        }
    }
    labels
}

/// The SVG charts [`plot_all`] draws for these traces, in its order: one
/// per trace, then the comparison.
fn svg_names(traces: &[String]) -> Vec<String> {
    let mut names: Vec<String> = trace_labels(traces)
        .iter()
        .map(|label| format!("overhead-{label}.svg"))
        .collect();
    names.push("policies.svg".into());
    names
}

/// The files [`plot_all`] writes for a sweep of these traces (as the rows
/// name them): each chart's SVG and, beside it, its PNG.
pub fn chart_files(traces: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    for svg in svg_names(traces) {
        let png = png_path(Path::new(&svg)).display().to_string();
        names.push(svg);
        names.push(png);
    }
    names
}

/// The files [`plot_all`] writes for these rows.
pub fn file_names(rows: &[Row]) -> Vec<String> {
    chart_files(&distinct(rows.iter().map(|r| r.trace.clone())))
}

/// Every chart for a sweep's rows: one per trace, and the comparison, each
/// as SVG and PNG. Returns the paths written.
pub fn plot_all(rows: &[Row], dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| plot_error(dir, e))?;
    let traces = distinct(rows.iter().map(|r| r.trace.clone()));
    let names = svg_names(&traces);
    let mut written = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let path = dir.join(name);
        match traces.get(i) {
            Some(trace) => overhead_chart(rows, trace, &path)?,
            None => comparison_chart(rows, &path)?,
        }
        let png = png_path(&path);
        written.push(path);
        written.push(png);
    }
    Ok(written)
}

/// A unit for memory axes: bytes per unit and its name (KiB, MiB or GiB,
/// whichever keeps the numbers short).
fn memory_unit(largest_bytes: f64) -> (f64, &'static str) {
    const KIB: f64 = 1024.0;
    if largest_bytes >= 2.0 * KIB * KIB * KIB {
        (KIB * KIB * KIB, "GiB")
    } else if largest_bytes >= 2.0 * KIB * KIB {
        (KIB * KIB, "MiB")
    } else {
        (KIB, "KiB")
    }
}

/// What a timeline chart may add to the samples: the trace's phases as
/// shaded bands, and a note at the peak (the op that reached it).
#[derive(Debug, Clone, Default)]
pub struct TimelineNotes {
    /// Forward, backward and optimizer stretches, drawn as bands.
    pub phases: Vec<Phase>,
    /// The op at the peak, written beside it.
    pub peak: Option<String>,
}

/// Memory in use over the logical clock of one replay: see [`timeline_chart_noted`].
pub fn timeline_chart(timeline: &Timeline, title: &str, path: &Path) -> Result<()> {
    timeline_chart_noted(timeline, title, &TimelineNotes::default(), path)
}

/// Memory in use over the logical clock of one replay, with the budget as a
/// dashed line, evictions and rematerialisations as ticks along the bottom,
/// the phases of `notes` as shaded bands and its peak note, and in arena
/// mode the fragmentation in a panel below.
pub fn timeline_chart_noted(
    timeline: &Timeline,
    title: &str,
    notes: &TimelineNotes,
    path: &Path,
) -> Result<()> {
    let samples = timeline.downsampled(1500);
    let end = samples.last().map_or(1, |s| s.clock + 1) as f64;
    let largest = samples
        .iter()
        .map(|s| s.in_use_bytes as f64)
        .chain(timeline.budget_bytes.map(|b| b as f64))
        .fold(1.0f64, f64::max);
    let (unit, unit_name) = memory_unit(largest);
    let budget = timeline.budget_bytes.map(|b| b as f64 / unit);
    let top = largest / unit * 1.15;
    let arena = samples.iter().any(|s| s.fragmentation.is_some());
    let height = if arena { 720 } else { 560 };
    render(path, (1200, height), |root| {
        let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
        let (left, side) = with_legend(root);
        let (upper, lower) = left.split_vertically(if arena { 540 } else { height });
        let mut chart = axes(&upper, title, 0.0..end, 0.0..top, path)?;
        chart
            .configure_mesh()
            .x_desc("trace event (logical clock)")
            .y_desc(format!("memory in use ({unit_name})"))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if top >= 20.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.1}")
                }
            })
            .label_style(("sans-serif", LABELS))
            .axis_desc_style(("sans-serif", DESCRIPTIONS))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| draw(&e))?;
        let mut entries = Vec::new();
        // Phases first, under everything else.
        let shades = [
            RGBColor(225, 235, 245),
            RGBColor(245, 230, 215),
            RGBColor(225, 240, 228),
        ];
        for (k, phase) in notes.phases.iter().enumerate() {
            let shade = shades[k % shades.len()];
            let (from, to) = (phase.start as f64, phase.end as f64);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(from, 0.0), (to, top)],
                    shade.filled(),
                )))
                .map_err(|e| draw(&e))?;
            chart
                .draw_series(std::iter::once(Text::new(
                    phase.name.clone(),
                    (from + (to - from) * 0.01, top * 0.985),
                    ("sans-serif", LABELS).into_font(),
                )))
                .map_err(|e| draw(&e))?;
            entries.push(Entry {
                label: format!("{} (events {}–{})", phase.name, phase.start, phase.end),
                color: shade,
                shape: Some((Shape::Square, true)),
                line: Stroke::None,
            });
        }
        chart
            .draw_series(LineSeries::new(
                samples
                    .iter()
                    .map(|s| (s.clock as f64, s.in_use_bytes as f64 / unit)),
                BLACK.stroke_width(2),
            ))
            .map_err(|e| draw(&e))?;
        entries.push(Entry::line("in use", BLACK, Stroke::Solid));
        let vermillion = PALETTE[1];
        let blue = PALETTE[0];
        if let Some(budget) = budget {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, budget), (end, budget)],
                    10,
                    6,
                    vermillion.stroke_width(2),
                ))
                .map_err(|e| draw(&e))?;
            entries.push(Entry::line("budget", vermillion, Stroke::Dashed));
        }
        if let Some(note) = &notes.peak {
            if let Some(peak) = samples.iter().max_by_key(|s| s.in_use_bytes) {
                let at = (peak.clock as f64, peak.in_use_bytes as f64 / unit);
                markers(
                    &mut chart,
                    std::iter::once(at),
                    (Shape::Diamond, 6),
                    BLACK,
                    true,
                    path,
                )?;
                entries.push(Entry {
                    label: note.clone(),
                    color: BLACK,
                    shape: Some((Shape::Diamond, true)),
                    line: Stroke::None,
                });
            }
        }
        // Ticks along the bottom: evictions in the lowest band, rematerialisations above.
        let band = top * 0.04;
        let ticks = |lift: f64, count: fn(&Sample) -> u64, color: RGBColor| {
            samples.iter().filter(move |s| count(s) > 0).map(move |s| {
                let x = s.clock as f64;
                PathElement::new(vec![(x, lift), (x, lift + band)], color.stroke_width(1))
            })
        };
        chart
            .draw_series(ticks(0.0, |s| s.evictions, vermillion))
            .map_err(|e| draw(&e))?;
        entries.push(Entry::line(
            "evictions (lower ticks)",
            vermillion,
            Stroke::Tick,
        ));
        chart
            .draw_series(ticks(band * 1.3, |s| s.rematerializations, blue))
            .map_err(|e| draw(&e))?;
        entries.push(Entry::line(
            "rematerialisations (upper ticks)",
            blue,
            Stroke::Tick,
        ));
        if arena {
            let purple = PALETTE[3];
            let mut panel = axes(&lower, "", 0.0..end, 0.0..1.0, path)?;
            panel
                .configure_mesh()
                .y_desc("fragmentation")
                .y_labels(3)
                .x_label_formatter(&|x| format!("{x:.0}"))
                .label_style(("sans-serif", LABELS))
                .axis_desc_style(("sans-serif", DESCRIPTIONS))
                .draw()
                .map_err(|e| draw(&e))?;
            panel
                .draw_series(LineSeries::new(
                    samples
                        .iter()
                        .filter_map(|s| Some((s.clock as f64, s.fragmentation?))),
                    purple.stroke_width(1),
                ))
                .map_err(|e| draw(&e))?;
            entries.push(Entry::line(
                "fragmentation (lower panel)",
                purple,
                Stroke::Solid,
            ));
        }
        draw_legend(&side, "", &entries, path)
    })
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
    render(path, (1100, 600), |root| {
        let draw = |e: &dyn std::fmt::Display| plot_error(path, e);
        let (area, side) = with_legend(root);
        let mut chart = axes(
            &area,
            "uniform chains under ⌈2√N⌉ activations: overhead stays O(1)",
            left..right,
            1.0..top,
            path,
        )?;
        chart
            .configure_mesh()
            .x_desc("chain length N (layers)")
            .y_desc("compute overhead (× the unbounded run's)")
            .x_label_formatter(&|x| format!("{:.0}", 10f64.powf(*x)))
            .label_style(("sans-serif", LABELS))
            .axis_desc_style(("sans-serif", DESCRIPTIONS))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| draw(&e))?;
        let mut entries = Vec::new();
        for (i, name) in policies.iter().enumerate() {
            let look = look(i);
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
            marked_line(&mut chart, &points, look, path)?;
            for (status, shape) in [
                (ReplayStatus::OutOfMemory, Shape::InvertedTriangle),
                (ReplayStatus::Thrash, Shape::Cross),
            ] {
                let stopped = rows
                    .iter()
                    .filter(|r| r.policy == *name && r.status == status)
                    .map(|r| (log(r.length), r.overhead.clamp(1.0, top)));
                markers(&mut chart, stopped, (shape, 6), look.color, false, path)?;
            }
            entries.push(Entry::series(label, look, Stroke::Solid));
        }
        for (status, shape, label) in [
            (
                ReplayStatus::OutOfMemory,
                Shape::InvertedTriangle,
                "stopped: out of memory",
            ),
            (ReplayStatus::Thrash, Shape::Cross, "stopped: thrashing"),
        ] {
            if rows.iter().any(|r| r.status == status) {
                entries.push(Entry {
                    label: label.into(),
                    color: GREY,
                    shape: Some((shape, false)),
                    line: Stroke::None,
                });
            }
        }
        draw_legend(&side, "policy", &entries, path)
    })
}

#[cfg(test)]
mod tests {
    use super::trace_labels;

    fn labels(traces: &[&str]) -> Vec<String> {
        trace_labels(&traces.iter().map(|t| t.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn trace_labels_are_short_and_distinct() {
        assert_eq!(
            labels(&[
                "traces/torchvision/mobilenet_v2-b16.jsonl",
                "traces/torchvision/resnet50-b16.jsonl",
                "traces/torchvision/vit_b_16-b8.jsonl",
            ]),
            ["mobilenet_v2", "resnet50", "vit_b_16"]
        );
        assert_eq!(
            labels(&[
                "t/resnet-small.jsonl",
                "t/resnet-large.jsonl",
                "t/resnet.jsonl"
            ]),
            ["resnet-small", "resnet-large", "resnet"]
        );
        assert_eq!(
            labels(&["a/x.jsonl", "b/x.jsonl", "resnet32-56-9.0-default.log"]),
            ["a-x", "b-x", "resnet32"]
        );
        assert_eq!(labels(&["x.jsonl", "x.log"]), ["x", "x-2"]);
    }
}
