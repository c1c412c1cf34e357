//! dtr's trace format: JSON lines, a versioned header, one event per line.
//! See `docs/trace-format.md`.

use std::borrow::Cow;
use std::fmt;
use std::io::Write;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::ids::TensorIds;
use super::{Text, Trace, TraceBuilder, TraceEvent, ValidJson};
use crate::error::{Error, Result};
use crate::ops::Op;
use crate::shape::Dims;

/// The format's name in the header line.
pub const FORMAT: &str = "dtr-trace";
/// The newest version this build reads and the one it writes. Version 2
/// adds dtypes other than f32 (traces recorded from PyTorch); version 3 the
/// `module` of an `apply`; version 4 the closing `end` line with the count of
/// events, so a trace cut short is detected.
pub const VERSION: u32 = 4;

/// The first version whose traces must close with an `end` line.
pub const END_MARKER_SINCE: u32 = 4;

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
    /// The last line of a version 4 trace: how many events precede it.
    End {
        events: u64,
    },
}

/// One output as the reader takes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputIn<'a> {
    id: u64,
    bytes: u64,
    #[serde(default)]
    alias_of: Option<usize>,
    #[serde(default)]
    dims: Option<Dims>,
    // `null` is refused, as `Output` refuses it (`Option` would take it).
    #[serde(borrow, default, deserialize_with = "some_text")]
    dtype: Option<Text<'a>>,
}

fn some_text<'de: 'a, 'a, D: Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<Text<'a>>, D::Error> {
    Text::deserialize(deserializer).map(Some)
}

impl OutputIn<'_> {
    fn dtype(&self) -> &str {
        self.dtype.as_deref().unwrap_or("f32")
    }
}

/// One line after the header, as the reader takes it: strings borrowed
/// from the text, shapes inline.
///
/// It is read by a visitor that wants `event` first, as [`TraceWriter`]
/// writes it, and refuses the line otherwise; a refused line is read again
/// as a [`Line`], serde's tagged enum, which accepts the same lines (the
/// tag anywhere) and words the errors.
enum Event<'a> {
    Put {
        id: u64,
        bytes: u64,
        dims: Option<Dims>,
        dtype: Option<Text<'a>>,
        data: Option<Vec<f32>>,
    },
    Apply {
        op: Text<'a>,
        kernel: Option<Box<Op>>,
        inputs: SmallVec<[u64; 4]>,
        outputs: Vec<OutputIn<'a>>,
        cost: u64,
        module: Option<Text<'a>>,
    },
    /// `retain`, `del`, `get`, `pin`, `unpin` or `detach`: the kind and the id.
    Use(UseKind, u64),
    /// The closing line, with the count of events before it.
    End(u64),
}

#[derive(Clone, Copy)]
enum UseKind {
    Retain,
    Del,
    Get,
    Pin,
    Unpin,
    Detach,
}

impl Event<'_> {
    /// Reads one line: the typed way, else through [`Line`].
    fn parse(text: &str) -> serde_json::Result<Event<'_>> {
        match serde_json::from_str(text) {
            Ok(event) => Ok(event),
            Err(_) => Ok(Event::from(serde_json::from_str::<Line>(text)?)),
        }
    }
}

impl<'a> From<Line> for Event<'a> {
    fn from(line: Line) -> Event<'a> {
        let text = |s: String| Text(Cow::Owned(s));
        match line {
            Line::Put {
                id,
                bytes,
                dims,
                dtype,
                data,
            } => Event::Put {
                id,
                bytes,
                dims: dims.map(Into::into),
                dtype: Some(text(dtype)),
                data,
            },
            Line::Apply {
                op,
                kernel,
                inputs,
                outputs,
                cost,
                module,
            } => Event::Apply {
                op: text(op),
                kernel: kernel.map(Box::new),
                inputs: inputs.into(),
                outputs: outputs
                    .into_iter()
                    .map(|o| OutputIn {
                        id: o.id,
                        bytes: o.bytes,
                        alias_of: o.alias_of,
                        dims: o.dims.map(Into::into),
                        dtype: Some(text(o.dtype)),
                    })
                    .collect(),
                cost,
                module: module.map(text),
            },
            Line::Retain { id } => Event::Use(UseKind::Retain, id),
            Line::Del { id } => Event::Use(UseKind::Del, id),
            Line::Get { id } => Event::Use(UseKind::Get, id),
            Line::Pin { id } => Event::Use(UseKind::Pin, id),
            Line::Unpin { id } => Event::Use(UseKind::Unpin, id),
            Line::Detach { id } => Event::Use(UseKind::Detach, id),
            Line::End { events } => Event::End(events),
        }
    }
}

/// Stores a field's value; a field given twice is refused.
fn once<T, E: de::Error>(slot: &mut Option<T>, value: T) -> std::result::Result<(), E> {
    match slot {
        Some(_) => Err(E::custom("a repeated field")),
        None => {
            *slot = Some(value);
            Ok(())
        }
    }
}

fn required<T, E: de::Error>(slot: Option<T>) -> std::result::Result<T, E> {
    slot.ok_or_else(|| E::custom("a missing field"))
}

impl<'de> Deserialize<'de> for Event<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct EventVisitor;

        impl<'de> Visitor<'de> for EventVisitor {
            type Value = Event<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object whose first key is `event`")
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Event<'de>, A::Error> {
                if map.next_key::<Text<'de>>()?.as_deref() != Some("event") {
                    return Err(de::Error::custom("`event` is not the first key"));
                }
                let kind: Text<'de> = map.next_value()?;
                let uses = match &*kind {
                    "put" => return put(map),
                    "apply" => return apply(map),
                    "retain" => UseKind::Retain,
                    "del" => UseKind::Del,
                    "get" => UseKind::Get,
                    "pin" => UseKind::Pin,
                    "unpin" => UseKind::Unpin,
                    "detach" => UseKind::Detach,
                    "end" => return end(map),
                    _ => return Err(de::Error::custom("an unknown event")),
                };
                let mut id = None;
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match &*key {
                        "id" => once(&mut id, map.next_value()?)?,
                        _ => return Err(de::Error::custom("an unknown field")),
                    }
                }
                Ok(Event::Use(uses, required(id)?))
            }
        }

        fn end<'de, A: MapAccess<'de>>(mut map: A) -> std::result::Result<Event<'de>, A::Error> {
            let mut events = None;
            while let Some(key) = map.next_key::<Text<'de>>()? {
                match &*key {
                    "events" => once(&mut events, map.next_value()?)?,
                    _ => return Err(de::Error::custom("an unknown field")),
                }
            }
            Ok(Event::End(required(events)?))
        }

        fn put<'de, A: MapAccess<'de>>(mut map: A) -> std::result::Result<Event<'de>, A::Error> {
            let (mut id, mut bytes, mut dims, mut dtype, mut data) = (None, None, None, None, None);
            while let Some(key) = map.next_key::<Text<'de>>()? {
                match &*key {
                    "id" => once(&mut id, map.next_value()?)?,
                    "bytes" => once(&mut bytes, map.next_value()?)?,
                    "dims" => once(&mut dims, map.next_value::<Option<Dims>>()?)?,
                    "dtype" => once(&mut dtype, map.next_value()?)?,
                    "data" => once(&mut data, map.next_value::<Option<Vec<f32>>>()?)?,
                    _ => return Err(de::Error::custom("an unknown field")),
                }
            }
            Ok(Event::Put {
                id: required(id)?,
                bytes: required(bytes)?,
                dims: dims.flatten(),
                dtype,
                data: data.flatten(),
            })
        }

        fn apply<'de, A: MapAccess<'de>>(mut map: A) -> std::result::Result<Event<'de>, A::Error> {
            let (mut op, mut kernel, mut inputs, mut outputs) = (None, None, None, None);
            let (mut cost, mut module) = (None, None);
            while let Some(key) = map.next_key::<Text<'de>>()? {
                match &*key {
                    "op" => once(&mut op, map.next_value()?)?,
                    "kernel" => once(&mut kernel, map.next_value::<Option<&'de RawValue>>()?)?,
                    "inputs" => once(&mut inputs, map.next_value()?)?,
                    "outputs" => once(&mut outputs, map.next_value()?)?,
                    "cost" => once(&mut cost, map.next_value()?)?,
                    "module" => once(&mut module, map.next_value::<Option<Text<'de>>>()?)?,
                    _ => return Err(de::Error::custom("an unknown field")),
                }
            }
            let kernel = match kernel.flatten() {
                None => None,
                // Checked as a whole first: `Op` skips fields it does not
                // know unchecked, which `Line` would refuse.
                Some(raw) => {
                    serde_json::from_str::<ValidJson>(raw.get()).map_err(de::Error::custom)?;
                    Some(serde_json::from_str(raw.get()).map_err(de::Error::custom)?)
                }
            };
            Ok(Event::Apply {
                op: required(op)?,
                kernel,
                inputs: required(inputs)?,
                outputs: required(outputs)?,
                cost: required(cost)?,
                module: module.flatten(),
            })
        }

        deserializer.deserialize_map(EventVisitor)
    }
}

/// Parses a native trace; `source` names it in errors (`source:line: …`).
pub fn parse(source: &str, text: &str) -> Result<Trace> {
    let fail = |line: usize, message: String| Error::Trace(format!("{source}:{line}: {message}"));
    let mut lines = super::numbered_lines(text);
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
    // The lines of real traces are longer than 24 bytes: an estimate from
    // above, for room that costs nothing until used.
    let estimate = text.len() / 24;
    builder.reserve(estimate);
    let mut ids = TensorIds::default();
    let resolve = |ids: &TensorIds, line: usize, id: u64| {
        ids.get(id)
            .ok_or_else(|| fail(line, format!("unknown tensor id {id}")))
    };
    let fresh = |ids: &TensorIds, line: usize, id: u64| {
        if ids.contains(id) {
            Err(fail(line, format!("tensor id {id} is defined twice")))
        } else {
            Ok(())
        }
    };
    // Events read so far, and the line of the closing `end` once read.
    let (mut count, mut ended, mut last_line) = (0u64, None::<usize>, header_line);
    for (line, text) in lines {
        if let Some(end_line) = ended {
            return Err(fail(
                line,
                format!("an event after the trace's `end` line (line {end_line})"),
            ));
        }
        last_line = line;
        let event = Event::parse(text).map_err(|e| fail(line, e.to_string()))?;
        count += 1;
        match event {
            Event::Put {
                id,
                bytes,
                dims,
                dtype,
                data,
            } => {
                let dtype = dtype.as_deref().unwrap_or("f32");
                fresh(&ids, line, id)?;
                check_dtype(dtype).map_err(|m| fail(line, m))?;
                if dtype != "f32" && data.is_some() {
                    return Err(fail(
                        line,
                        format!("`data` is for f32 tensors, not {dtype}"),
                    ));
                }
                let tensor = builder.put(line, bytes, dims, data)?;
                ids.insert(id, tensor);
            }
            Event::Apply {
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
                let mut specs: SmallVec<[_; 2]> = SmallVec::with_capacity(outputs.len());
                for output in &outputs {
                    fresh(&ids, line, output.id)?;
                    check_dtype(output.dtype()).map_err(|m| fail(line, m))?;
                    if kernel.is_some() && output.dtype() != "f32" {
                        return Err(fail(
                            line,
                            format!(
                                "`{}` has a kernel, but its output {} is {}: kernels compute f32",
                                &*op,
                                output.id,
                                output.dtype()
                            ),
                        ));
                    }
                    specs.push((output.bytes, output.alias_of, output.dims.clone()));
                }
                if let Some(repeated) = first_repeated(&outputs) {
                    return Err(fail(line, format!("output id {repeated} is repeated")));
                }
                let label = |i: usize| format!("input id {} of `{}`", inputs[i], &*op);
                let made = builder.apply(
                    line,
                    &op,
                    kernel,
                    resolved,
                    &specs,
                    cost,
                    module.as_ref().map(|m| &*m.0),
                    &label,
                )?;
                for (output, tensor) in outputs.iter().zip(made) {
                    ids.insert(output.id, tensor);
                }
            }
            Event::End(events) => {
                if header.version < END_MARKER_SINCE {
                    return Err(fail(
                        line,
                        format!(
                            "`end` is a version {END_MARKER_SINCE} event; this trace is version {}",
                            header.version
                        ),
                    ));
                }
                let before = count - 1;
                if events != before {
                    return Err(fail(
                        line,
                        format!(
                            "the `end` line counts {events} events, but {before} precede it: \
                             lines are missing or were added"
                        ),
                    ));
                }
                ended = Some(line);
            }
            Event::Use(kind, id) => {
                let tensor = resolve(&ids, line, id)?;
                let label = format_args!("tensor id {id}");
                match kind {
                    UseKind::Retain => builder.retain(line, tensor, &label)?,
                    UseKind::Del => builder.del(line, tensor, &label)?,
                    UseKind::Get => builder.read(line, TraceEvent::Get { tensor }, &label)?,
                    UseKind::Pin => builder.read(line, TraceEvent::Pin { tensor }, &label)?,
                    UseKind::Unpin => builder.read(line, TraceEvent::Unpin { tensor }, &label)?,
                    UseKind::Detach => builder.read(line, TraceEvent::Detach { tensor }, &label)?,
                }
            }
        }
    }
    if header.version >= END_MARKER_SINCE && ended.is_none() {
        return Err(fail(
            last_line,
            format!(
                "the trace stops after {count} events without its closing \
                 `{{\"event\":\"end\",\"events\":{count}}}` line: it was cut short, \
                 or the program writing it did not finish"
            ),
        ));
    }
    Ok(builder.finish())
}

/// The first output whose id an earlier output has.
fn first_repeated(outputs: &[OutputIn<'_>]) -> Option<u64> {
    if outputs.len() <= 16 {
        return (1..outputs.len())
            .find(|&j| outputs[..j].iter().any(|o| o.id == outputs[j].id))
            .map(|j| outputs[j].id);
    }
    let mut distinct = std::collections::HashSet::with_capacity(outputs.len());
    outputs
        .iter()
        .find(|o| !distinct.insert(o.id))
        .map(|o| o.id)
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
    /// Events written so far, for the closing `end` line.
    events: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace: writes the header line.
    pub fn new(mut out: W) -> std::io::Result<TraceWriter<W>> {
        let header = Header {
            format: FORMAT.into(),
            version: VERSION,
        };
        writeln!(out, "{}", serde_json::to_string(&header)?)?;
        Ok(TraceWriter { out, events: 0 })
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
                data: data.as_deref().map(<[f32]>::to_vec),
            },
            TraceEvent::Apply(apply) => Line::Apply {
                op: apply.op.to_string(),
                kernel: apply.kernel.as_deref().cloned(),
                inputs: apply.inputs.iter().map(|&t| t as u64).collect(),
                outputs: apply
                    .outputs
                    .iter()
                    .map(|o| Output {
                        id: o.tensor as u64,
                        bytes: o.bytes,
                        alias_of: o.alias_of,
                        dims: o.dims.as_ref().map(|d| d.to_vec()),
                        dtype: f32_dtype(),
                    })
                    .collect(),
                cost: apply.cost,
                module: apply.module.as_deref().map(str::to_string),
            },
            TraceEvent::Retain { tensor } => Line::Retain { id: *tensor as u64 },
            TraceEvent::Del { tensor } => Line::Del { id: *tensor as u64 },
            TraceEvent::Get { tensor } => Line::Get { id: *tensor as u64 },
            TraceEvent::Pin { tensor } => Line::Pin { id: *tensor as u64 },
            TraceEvent::Unpin { tensor } => Line::Unpin { id: *tensor as u64 },
            TraceEvent::Detach { tensor } => Line::Detach { id: *tensor as u64 },
        };
        writeln!(self.out, "{}", serde_json::to_string(&line)?)?;
        self.events += 1;
        Ok(())
    }

    /// Ends the trace: writes the closing `end` line and flushes. A trace
    /// without it (the writer dropped early) reads as cut short.
    pub fn finish(&mut self) -> std::io::Result<()> {
        let end = Line::End {
            events: self.events,
        };
        writeln!(self.out, "{}", serde_json::to_string(&end)?)?;
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
    writer.finish().expect("writing to memory cannot fail");
    String::from_utf8(buffer).expect("JSON is UTF-8")
}
