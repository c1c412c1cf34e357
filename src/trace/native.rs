//! dtr's trace format: JSON lines, a versioned header, one event per line.
//! See `docs/trace-format.md`.

use std::collections::HashMap;
use std::io::Write;

use serde::{Deserialize, Serialize};

use super::{Trace, TraceBuilder, TraceEvent, TraceTensor};
use crate::error::{Error, Result};
use crate::ops::Op;

/// The format's name in the header line.
pub const FORMAT: &str = "dtr-trace";
/// The newest version this build reads and the one it writes. Version 2
/// adds dtypes other than f32 (traces recorded from PyTorch); version 3 the
/// `module` of an `apply`.
pub const VERSION: u32 = 3;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    format: String,
    version: u32,
}

fn f32_dtype() -> String {
    "f32".to_string()
}

/// One output as written in an `apply` line.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Output {
    id: u64,
    bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    alias_of: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dims: Option<Vec<usize>>,
    #[serde(default = "f32_dtype")]
    dtype: String,
}

/// One line after the header.
#[derive(Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
enum Line {
    Put {
        id: u64,
        bytes: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dims: Option<Vec<usize>>,
        #[serde(default = "f32_dtype")]
        dtype: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Vec<f32>>,
    },
    Apply {
        op: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kernel: Option<Op>,
        inputs: Vec<u64>,
        outputs: Vec<Output>,
        cost: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        module: Option<String>,
    },
    Retain {
        id: u64,
    },
    Del {
        id: u64,
    },
    Get {
        id: u64,
    },
    Pin {
        id: u64,
    },
    Unpin {
        id: u64,
    },
    Detach {
        id: u64,
    },
}

/// Parses a native trace; `source` names it in errors (`source:line: …`).
pub fn parse(source: &str, text: &str) -> Result<Trace> {
    let fail = |line: usize, message: String| Error::Trace(format!("{source}:{line}: {message}"));
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty());
    let Some((header_line, header)) = lines.next() else {
        return Err(fail(1, "empty file: expected a dtr-trace header".into()));
    };
    let header: Header = serde_json::from_str(header).map_err(|e| {
        fail(
            header_line,
            format!("bad header (expected {{\"format\":\"{FORMAT}\",\"version\":{VERSION}}}): {e}"),
        )
    })?;
    if header.format != FORMAT {
        return Err(fail(
            header_line,
            format!("format is `{}`, expected `{FORMAT}`", header.format),
        ));
    }
    if header.version == 0 || header.version > VERSION {
        return Err(fail(
            header_line,
            format!(
                "version {} is not supported (this build reads 1..={VERSION})",
                header.version
            ),
        ));
    }

    let mut builder = TraceBuilder::new(source);
    let mut ids: HashMap<u64, TraceTensor> = HashMap::new();
    let resolve = |ids: &HashMap<u64, TraceTensor>, line: usize, id: u64| {
        ids.get(&id)
            .copied()
            .ok_or_else(|| fail(line, format!("unknown tensor id {id}")))
    };
    let fresh = |ids: &HashMap<u64, TraceTensor>, line: usize, id: u64| {
        if ids.contains_key(&id) {
            Err(fail(line, format!("tensor id {id} is defined twice")))
        } else {
            Ok(())
        }
    };
    for (line, text) in lines {
        let event: Line = serde_json::from_str(text).map_err(|e| fail(line, e.to_string()))?;
        match event {
            Line::Put {
                id,
                bytes,
                dims,
                dtype,
                data,
            } => {
                fresh(&ids, line, id)?;
                check_dtype(&dtype).map_err(|m| fail(line, m))?;
                if dtype != "f32" && data.is_some() {
                    return Err(fail(
                        line,
                        format!("`data` is for f32 tensors, not {dtype}"),
                    ));
                }
                let tensor = builder.put(line, bytes, dims.map(Into::into), data)?;
                ids.insert(id, tensor);
            }
            Line::Apply {
                op,
                kernel,
                inputs,
                outputs,
                cost,
                module,
            } => {
                let resolved = inputs
                    .iter()
                    .map(|&id| resolve(&ids, line, id))
                    .collect::<Result<_>>()?;
                let mut specs = Vec::with_capacity(outputs.len());
                for output in &outputs {
                    fresh(&ids, line, output.id)?;
                    check_dtype(&output.dtype).map_err(|m| fail(line, m))?;
                    if kernel.is_some() && output.dtype != "f32" {
                        return Err(fail(
                            line,
                            format!(
                                "`{op}` has a kernel, but its output {} is {}: kernels compute f32",
                                output.id, output.dtype
                            ),
                        ));
                    }
                    specs.push((
                        output.bytes,
                        output.alias_of,
                        output.dims.as_deref().map(Into::into),
                    ));
                }
                let mut distinct = std::collections::HashSet::with_capacity(outputs.len());
                if let Some(repeated) = outputs.iter().find(|o| !distinct.insert(o.id)) {
                    return Err(fail(line, format!("output id {} is repeated", repeated.id)));
                }
                let label = |i: usize| format!("input id {} of `{op}`", inputs[i]);
                let made = builder.apply(
                    line,
                    op.clone(),
                    kernel,
                    resolved,
                    &specs,
                    cost,
                    module,
                    &label,
                )?;
                for (output, tensor) in outputs.iter().zip(made) {
                    ids.insert(output.id, tensor);
                }
            }
            Line::Retain { id } => {
                builder.retain(line, resolve(&ids, line, id)?, &format!("tensor id {id}"))?
            }
            Line::Del { id } => {
                builder.del(line, resolve(&ids, line, id)?, &format!("tensor id {id}"))?
            }
            Line::Get { id } => builder.read(
                line,
                TraceEvent::Get {
                    tensor: resolve(&ids, line, id)?,
                },
                &format!("tensor id {id}"),
            )?,
            Line::Pin { id } => builder.read(
                line,
                TraceEvent::Pin {
                    tensor: resolve(&ids, line, id)?,
                },
                &format!("tensor id {id}"),
            )?,
            Line::Unpin { id } => builder.read(
                line,
                TraceEvent::Unpin {
                    tensor: resolve(&ids, line, id)?,
                },
                &format!("tensor id {id}"),
            )?,
            Line::Detach { id } => builder.read(
                line,
                TraceEvent::Detach {
                    tensor: resolve(&ids, line, id)?,
                },
                &format!("tensor id {id}"),
            )?,
        }
    }
    Ok(builder.finish())
}

/// The element types a trace may name. Only f32 tensors carry data or run
/// on data backends; the others are sizes for the simulator.
pub const DTYPES: &[&str] = &[
    "f32", "f64", "f16", "bf16", "f8e4m3", "f8e5m2", "i64", "i32", "i16", "i8", "u64", "u32",
    "u16", "u8", "bool", "c64", "c128", "other",
];

fn check_dtype(dtype: &str) -> std::result::Result<(), String> {
    if DTYPES.contains(&dtype) {
        Ok(())
    } else {
        Err(format!(
            "dtype `{dtype}` is not one of {}",
            DTYPES.join(", ")
        ))
    }
}

/// Writes traces in the native format, one event at a time.
pub struct TraceWriter<W: Write> {
    out: W,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace: writes the header line.
    pub fn new(mut out: W) -> std::io::Result<TraceWriter<W>> {
        let header = Header {
            format: FORMAT.into(),
            version: VERSION,
        };
        writeln!(out, "{}", serde_json::to_string(&header)?)?;
        Ok(TraceWriter { out })
    }

    /// Writes one event, naming tensors by their dense index.
    pub fn write(&mut self, event: &TraceEvent) -> std::io::Result<()> {
        let line = match event {
            TraceEvent::Put {
                tensor,
                bytes,
                dims,
                data,
            } => Line::Put {
                id: *tensor as u64,
                bytes: *bytes,
                dims: dims.as_ref().map(|d| d.to_vec()),
                dtype: f32_dtype(),
                data: data.clone(),
            },
            TraceEvent::Apply {
                op,
                kernel,
                inputs,
                outputs,
                cost,
                module,
            } => Line::Apply {
                op: op.clone(),
                kernel: kernel.clone(),
                inputs: inputs.iter().map(|&t| t as u64).collect(),
                outputs: outputs
                    .iter()
                    .map(|o| Output {
                        id: o.tensor as u64,
                        bytes: o.bytes,
                        alias_of: o.alias_of,
                        dims: o.dims.as_ref().map(|d| d.to_vec()),
                        dtype: f32_dtype(),
                    })
                    .collect(),
                cost: *cost,
                module: module.clone(),
            },
            TraceEvent::Retain { tensor } => Line::Retain { id: *tensor as u64 },
            TraceEvent::Del { tensor } => Line::Del { id: *tensor as u64 },
            TraceEvent::Get { tensor } => Line::Get { id: *tensor as u64 },
            TraceEvent::Pin { tensor } => Line::Pin { id: *tensor as u64 },
            TraceEvent::Unpin { tensor } => Line::Unpin { id: *tensor as u64 },
            TraceEvent::Detach { tensor } => Line::Detach { id: *tensor as u64 },
        };
        writeln!(self.out, "{}", serde_json::to_string(&line)?)
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The whole trace as native text.
pub fn to_string(trace: &Trace) -> String {
    let mut buffer = Vec::new();
    let mut writer = TraceWriter::new(&mut buffer).expect("writing to memory cannot fail");
    for event in &trace.events {
        writer.write(event).expect("writing to memory cannot fail");
    }
    String::from_utf8(buffer).expect("JSON is UTF-8")
}
