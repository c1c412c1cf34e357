//! Importer for the DTR authors' simulator logs (`simrd`).
//!
//! Each line is a JSON object with an `INSTRUCTION`; numbers are decimal
//! strings (plain numbers are accepted too). Lines before the first
//! `ANNOTATE START` are skipped. `CONSTANT` + `MEMORY` is a put; `CALL` is
//! followed, per result, by `MEMORY` and `ALIAS`; `MUTATE` replaces the
//! mutated arguments by new tensors of their storages' sizes and releases
//! the old ones; `COPY` adds a name for a tensor (+1 reference); `COPY_FROM`
//! rebinds a name; `RELEASE` drops one reference (unknown names are
//! ignored). At the end every tensor still referenced is an output, pinned
//! in the order its name first appeared.
//!
//! Lines are deserialized straight into `Instruction`s that borrow their
//! names from the text, on two threads (see `trace::lines`), and imported
//! in order on this one. A line the typed reader refuses (bad JSON, not an
//! object, a repeated key, an object where a field's value should be) is
//! read again as a `serde_json::Value`, which gives today's message or, for
//! a valid object, the same instruction: the slow path only runs on lines
//! that real logs do not have.

use std::borrow::Cow;
use std::collections::hash_map::{Entry, HashMap};
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use smallvec::SmallVec;

use super::{OutputSpec, Text, Trace, TraceBuilder, TraceEvent, TraceTensor, ValidJson};
use crate::error::{Error, Result};

/// A field's value. Strings and integers, all that real logs hold, are
/// typed (strings borrowed from the text unless they had escapes); other
/// values are kept as JSON for the messages that refuse them.
#[derive(Debug, Clone, PartialEq)]
enum Field<'a> {
    Str(Cow<'a, str>),
    Int(i64),
    /// A list of strings only (as `ARGS` and `RESULT` are).
    Names(Box<[Cow<'a, str>]>),
    List(Box<[Field<'a>]>),
    /// A float, an integer past `i64`, a boolean, null or an object.
    Other(Box<Value>),
}

impl<'a> Field<'a> {
    fn from_value(value: Value) -> Field<'a> {
        match value {
            Value::String(s) => Field::Str(Cow::Owned(s)),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Field::Int(i),
                None => Field::Other(Box::new(Value::Number(n))),
            },
            Value::Array(items) => Field::list(items.into_iter().map(Field::from_value).collect()),
            other => Field::Other(Box::new(other)),
        }
    }

    /// A list: [`Field::Names`] when every item is a string.
    fn list(items: Vec<Field<'a>>) -> Field<'a> {
        if !items.iter().all(|item| matches!(item, Field::Str(_))) {
            return Field::List(items.into_boxed_slice());
        }
        let names = items.into_iter().map(|item| match item {
            Field::Str(s) => s,
            _ => unreachable!("all strings"),
        });
        Field::Names(names.collect())
    }

    /// An integer for a string that reads as one (decimal, spaces around
    /// allowed): numbers come as strings in the logs, and reading them here,
    /// on the reading threads, spares the import.
    fn number(self) -> Field<'a> {
        match self {
            Field::Str(s) => match decimal(&s) {
                Some(i) => Field::Int(i),
                None => Field::Str(s),
            },
            other => other,
        }
    }

    fn to_value(&self) -> Value {
        match self {
            Field::Str(s) => Value::String(s.to_string()),
            Field::Int(i) => Value::from(*i),
            Field::Names(names) => Value::Array(
                names
                    .iter()
                    .map(|name| Value::String(name.to_string()))
                    .collect(),
            ),
            Field::List(items) => Value::Array(items.iter().map(Field::to_value).collect()),
            Field::Other(value) => (**value).clone(),
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Field::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A decimal string or a JSON integer.
    fn integer(&self) -> Option<i64> {
        match self {
            Field::Str(s) => decimal(s),
            Field::Int(i) => Some(*i),
            _ => None,
        }
    }
}

/// A decimal integer, spaces around allowed. The logs' numbers have none,
/// so trimming (a walk over Unicode's spaces) waits for a first miss.
fn decimal(s: &str) -> Option<i64> {
    s.parse().or_else(|_| s.trim().parse()).ok()
}

/// As JSON, the way `serde_json::Value` prints it.
impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_value())
    }
}

impl<'de> Deserialize<'de> for Field<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct FieldVisitor;

        impl<'de> Visitor<'de> for FieldVisitor {
            type Value = Field<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number, boolean, null or list")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Str(Cow::Borrowed(s)))
            }

            fn visit_str<E>(self, s: &str) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Str(Cow::Owned(s.to_string())))
            }

            fn visit_string<E>(self, s: String) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Str(Cow::Owned(s)))
            }

            fn visit_i64<E>(self, i: i64) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Int(i))
            }

            fn visit_u64<E>(self, u: u64) -> std::result::Result<Field<'de>, E> {
                Ok(match i64::try_from(u) {
                    Ok(i) => Field::Int(i),
                    Err(_) => Field::Other(Box::new(Value::from(u))),
                })
            }

            fn visit_f64<E>(self, x: f64) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Other(Box::new(Value::from(x))))
            }

            fn visit_bool<E>(self, b: bool) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Other(Box::new(Value::Bool(b))))
            }

            fn visit_unit<E>(self) -> std::result::Result<Field<'de>, E> {
                Ok(Field::Other(Box::new(Value::Null)))
            }

            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Field<'de>, A::Error> {
                // On the stack while read, then one allocation of the right
                // size (collecting would grow a `Vec`, then shrink it).
                let mut items: SmallVec<[Field<'de>; 8]> = SmallVec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                let mut list = Vec::with_capacity(items.len());
                list.extend(items);
                Ok(Field::list(list))
            }
            // An object is refused: the line goes the slow way.
        }

        deserializer.deserialize_any(FieldVisitor)
    }
}

/// A field an instruction reads; `None` when the line lacks it.
type Slot<'a> = Option<Field<'a>>;

/// One line, with the fields its kind reads (the others are dropped).
#[derive(Debug)]
enum Body<'a> {
    Annotate {
        start: bool,
    },
    Constant {
        name: Slot<'a>,
    },
    Memory {
        name: Slot<'a>,
        memory: Slot<'a>,
    },
    Alias {
        name: Slot<'a>,
        alias: Slot<'a>,
    },
    Copy {
        dst: Slot<'a>,
        src: Slot<'a>,
    },
    CopyFrom {
        dst: Slot<'a>,
        src: Slot<'a>,
    },
    Release {
        name: Slot<'a>,
    },
    Call {
        name: Slot<'a>,
        args: Slot<'a>,
        result: Slot<'a>,
        time: Slot<'a>,
    },
    Mutate {
        name: Slot<'a>,
        args: Slot<'a>,
        mutate: Slot<'a>,
        time: Slot<'a>,
    },
    /// Another `INSTRUCTION`; empty when it is missing or not a string.
    Unknown(Cow<'a, str>),
}

/// Every key the importer reads, gathered before the kind is known (keys
/// come in any order).
#[derive(Default)]
struct Keys<'a> {
    instruction: Slot<'a>,
    annotation: Slot<'a>,
    name: Slot<'a>,
    memory: Slot<'a>,
    alias: Slot<'a>,
    dst: Slot<'a>,
    src: Slot<'a>,
    args: Slot<'a>,
    result: Slot<'a>,
    time: Slot<'a>,
    mutate: Slot<'a>,
}

impl<'a> Keys<'a> {
    /// The slot for `key`, or `None` for a key no instruction reads.
    fn slot(&mut self, key: &str) -> Option<&mut Slot<'a>> {
        Some(match key {
            "INSTRUCTION" => &mut self.instruction,
            "ANNOTATION" => &mut self.annotation,
            "NAME" => &mut self.name,
            "MEMORY" => &mut self.memory,
            "ALIAS" => &mut self.alias,
            "DST" => &mut self.dst,
            "SRC" => &mut self.src,
            "ARGS" => &mut self.args,
            "RESULT" => &mut self.result,
            "TIME" => &mut self.time,
            "MUTATE" => &mut self.mutate,
            _ => return None,
        })
    }

    fn into_body(self) -> Body<'a> {
        let number = |slot: Slot<'a>| slot.map(Field::number);
        let kind = match self.instruction {
            Some(Field::Str(kind)) => kind,
            _ => Cow::Borrowed(""),
        };
        match &*kind {
            "ANNOTATE" => Body::Annotate {
                start: self.annotation.as_ref().and_then(Field::as_str) == Some("START"),
            },
            "CONSTANT" => Body::Constant { name: self.name },
            "MEMORY" => Body::Memory {
                name: self.name,
                memory: number(self.memory),
            },
            "ALIAS" => Body::Alias {
                name: self.name,
                alias: number(self.alias),
            },
            "COPY" => Body::Copy {
                dst: self.dst,
                src: self.src,
            },
            "COPY_FROM" => Body::CopyFrom {
                dst: self.dst,
                src: self.src,
            },
            "RELEASE" => Body::Release { name: self.name },
            "CALL" => Body::Call {
                name: self.name,
                args: self.args,
                result: self.result,
                time: number(self.time),
            },
            "MUTATE" => Body::Mutate {
                name: self.name,
                args: self.args,
                mutate: self.mutate,
                time: number(self.time),
            },
            _ => Body::Unknown(kind),
        }
    }

    /// The slow path's object, with JSON's last-wins for repeated keys.
    fn from_object(object: serde_json::Map<String, Value>) -> Keys<'a> {
        let mut keys = Keys::default();
        for (key, value) in object {
            if let Some(slot) = keys.slot(&key) {
                *slot = Some(Field::from_value(value));
            }
        }
        keys
    }
}

impl<'de> Deserialize<'de> for Body<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct BodyVisitor;

        impl<'de> Visitor<'de> for BodyVisitor {
            type Value = Body<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Body<'de>, A::Error> {
                let mut keys = Keys::default();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match keys.slot(&key) {
                        // The slow path keeps the last, as `Value` does.
                        Some(Some(_)) => return Err(de::Error::custom("a repeated key")),
                        Some(slot) => *slot = Some(map.next_value()?),
                        None => {
                            map.next_value::<ValidJson>()?;
                        }
                    }
                }
                Ok(keys.into_body())
            }
        }

        deserializer.deserialize_map(BodyVisitor)
    }
}

/// One parsed line: its number and what it says.
#[derive(Debug)]
struct Instruction<'a> {
    line: usize,
    body: Body<'a>,
}

impl<'a> Instruction<'a> {
    fn kind(&self) -> &str {
        match &self.body {
            Body::Unknown(kind) => kind,
            _ => self.known_kind(),
        }
    }

    /// The kind's name; empty for [`Body::Unknown`].
    fn known_kind(&self) -> &'static str {
        match &self.body {
            Body::Annotate { .. } => "ANNOTATE",
            Body::Constant { .. } => "CONSTANT",
            Body::Memory { .. } => "MEMORY",
            Body::Alias { .. } => "ALIAS",
            Body::Copy { .. } => "COPY",
            Body::CopyFrom { .. } => "COPY_FROM",
            Body::Release { .. } => "RELEASE",
            Body::Call { .. } => "CALL",
            Body::Mutate { .. } => "MUTATE",
            Body::Unknown(_) => "",
        }
    }

    /// Reads one non-blank line; the message says why it does not read.
    fn read(raw: &'a str) -> std::result::Result<Body<'a>, String> {
        if let Ok(body) = serde_json::from_str::<Body<'a>>(raw) {
            return Ok(body);
        }
        // The typed reader refused it: the slow path gives the message, or
        // the instruction when the line is an object after all.
        match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(object)) => Ok(Keys::from_object(object).into_body()),
            Ok(other) => Err(format!("expected a JSON object, got {other}")),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What the next line must be: the lines that follow a CONSTANT or a CALL.
enum Awaiting<'t> {
    Nothing,
    /// The MEMORY line of a CONSTANT on `line`.
    Constant {
        line: usize,
        name: Cow<'t, str>,
    },
    Call(Box<PendingCall<'t>>),
}

/// A CALL whose MEMORY and ALIAS lines, one pair per result, are being read.
struct PendingCall<'t> {
    line: usize,
    op: Cow<'t, str>,
    args: Box<[Cow<'t, str>]>,
    results: Box<[Cow<'t, str>]>,
    cost: u64,
    inputs: SmallVec<[TraceTensor; 4]>,
    outputs: SmallVec<[OutputSpec; 2]>,
    /// The line and value of the current result's MEMORY, once read.
    memory: Option<(usize, Slot<'t>)>,
}

impl PendingCall<'_> {
    /// The result whose lines come next.
    fn result(&self) -> &str {
        &self.results[self.outputs.len()]
    }
}

/// Imports instructions one at a time, as they are read.
struct Importer<'t> {
    source: &'t str,
    builder: TraceBuilder,
    /// Name → tensor; a name keeps its first position when rebound.
    names: HashMap<Cow<'t, str>, TraceTensor, foldhash::fast::RandomState>,
    name_order: Vec<Cow<'t, str>>,
    awaiting: Awaiting<'t>,
    /// The line of the last instruction imported.
    last_line: usize,
}

impl<'t> Importer<'t> {
    /// An importer for a log of about `lines` lines.
    fn new(source: &'t str, lines: usize) -> Importer<'t> {
        let mut builder = TraceBuilder::new(source);
        builder.reserve(lines);
        Importer {
            source,
            builder,
            // About one name in three lines (a CALL's result has three).
            names: HashMap::with_capacity_and_hasher(lines / 3, Default::default()),
            name_order: Vec::with_capacity(lines / 3),
            awaiting: Awaiting::Nothing,
            last_line: 0,
        }
    }

    fn fail(&self, line: usize, message: impl fmt::Display) -> Error {
        Error::Trace(format!("{}:{line}: {message}", self.source))
    }

    /// The value of `key` on `line`, an instruction of `kind`.
    fn field<'v>(
        &self,
        (line, kind): (usize, &str),
        key: &str,
        slot: &'v Slot<'t>,
    ) -> Result<&'v Field<'t>> {
        slot.as_ref()
            .ok_or_else(|| self.fail(line, format!("{kind} is missing field `{key}`")))
    }

    fn string(&self, at: (usize, &str), key: &str, slot: Slot<'t>) -> Result<Cow<'t, str>> {
        match slot {
            Some(Field::Str(s)) => Ok(s),
            other => {
                let value = self.field(at, key, &other)?;
                Err(self.fail(at.0, format!("`{key}` must be a string, got {value}")))
            }
        }
    }

    /// A decimal string or a JSON integer.
    fn integer(&self, line: usize, key: &str, value: &Field<'_>) -> Result<i64> {
        value
            .integer()
            .ok_or_else(|| self.fail(line, format!("`{key}` must be an integer, got {value}")))
    }

    fn unsigned(&self, at: (usize, &str), key: &str, slot: &Slot<'t>) -> Result<u64> {
        let value = self.integer(at.0, key, self.field(at, key, slot)?)?;
        u64::try_from(value)
            .map_err(|_| self.fail(at.0, format!("`{key}` must not be negative, got {value}")))
    }

    fn list(&self, at: (usize, &str), key: &str, slot: Slot<'t>) -> Result<Vec<Field<'t>>> {
        match slot {
            Some(Field::List(items)) => Ok(items.into_vec()),
            Some(Field::Names(names)) => Ok(names.into_vec().into_iter().map(Field::Str).collect()),
            other => {
                let value = self.field(at, key, &other)?;
                Err(self.fail(at.0, format!("`{key}` must be a list, got {value}")))
            }
        }
    }

    fn names_of(
        &self,
        at: (usize, &str),
        key: &str,
        slot: Slot<'t>,
    ) -> Result<Box<[Cow<'t, str>]>> {
        if let Some(Field::Names(names)) = slot {
            return Ok(names);
        }
        self.list(at, key, slot)?
            .into_iter()
            .map(|v| match v {
                Field::Str(s) => Ok(s),
                other => Err(self.fail(at.0, format!("`{key}` must list names, got {other}"))),
            })
            .collect()
    }

    fn tensor(&self, line: usize, name: &str) -> Result<TraceTensor> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| self.fail(line, format!("unknown tensor `{name}`")))
    }

    fn inputs(&self, line: usize, args: &[Cow<'t, str>]) -> Result<SmallVec<[TraceTensor; 4]>> {
        args.iter().map(|a| self.tensor(line, a)).collect()
    }

    fn bind(&mut self, name: Cow<'t, str>, tensor: TraceTensor) {
        match self.names.entry(name) {
            Entry::Occupied(bound) => *bound.into_mut() = tensor,
            Entry::Vacant(free) => {
                self.name_order.push(free.key().clone());
                free.insert(tensor);
            }
        }
    }

    fn bind_new(&mut self, line: usize, name: Cow<'t, str>, tensor: TraceTensor) -> Result<()> {
        match self.names.entry(name) {
            Entry::Occupied(bound) => {
                let message = format!("tensor `{}` is defined twice", bound.key());
                Err(self.fail(line, message))
            }
            Entry::Vacant(free) => {
                self.name_order.push(free.key().clone());
                free.insert(tensor);
                Ok(())
            }
        }
    }

    /// Checks that `next` is a `kind` line (`MEMORY` or `ALIAS`) naming
    /// `name`, and returns its value field.
    fn expect(&self, next: Instruction<'t>, kind: &str, name: &str) -> Result<Slot<'t>> {
        if next.kind() != kind {
            return Err(self.fail(
                next.line,
                format!("expected {kind} for `{name}`, found {}", next.kind()),
            ));
        }
        let (found, value) = match next.body {
            Body::Memory { name, memory } => (name, memory),
            Body::Alias { name, alias } => (name, alias),
            _ => unreachable!("the kind was checked"),
        };
        let found = self.string((next.line, kind), "NAME", found)?;
        if found != name {
            return Err(self.fail(
                next.line,
                format!("{kind} names `{found}`, expected `{name}`"),
            ));
        }
        Ok(value)
    }

    /// Imports the next instruction.
    fn step(&mut self, ins: Instruction<'t>) -> Result<()> {
        self.last_line = ins.line;
        match std::mem::replace(&mut self.awaiting, Awaiting::Nothing) {
            Awaiting::Nothing => self.start(ins),
            Awaiting::Constant { line, name } => {
                let memory_line = ins.line;
                let memory = self.expect(ins, "MEMORY", &name)?;
                let bytes = self.unsigned((memory_line, "MEMORY"), "MEMORY", &memory)?;
                let tensor = self.builder.put(line, bytes, None, None)?;
                self.bind_new(line, name, tensor)
            }
            Awaiting::Call(mut call) => {
                let Some((memory_line, memory)) = call.memory.take() else {
                    let memory_line = ins.line;
                    call.memory = Some((memory_line, self.expect(ins, "MEMORY", call.result())?));
                    self.awaiting = Awaiting::Call(call);
                    return Ok(());
                };
                let alias_line = ins.line;
                let alias = self.expect(ins, "ALIAS", call.result())?;
                let bytes = self.unsigned((memory_line, "MEMORY"), "MEMORY", &memory)?;
                let alias_value = self.field((alias_line, "ALIAS"), "ALIAS", &alias)?;
                let alias_of = match self.integer(alias_line, "ALIAS", alias_value)? {
                    -1 => None,
                    index if index >= 0 => Some(index as usize),
                    index => {
                        return Err(self.fail(
                            alias_line,
                            format!("ALIAS must be -1 or an argument index, got {index}"),
                        ))
                    }
                };
                let bytes = if alias_of.is_some() { 0 } else { bytes };
                call.outputs.push((bytes, alias_of, None));
                self.call_or_wait(call)
            }
        }
    }

    /// An instruction that does not continue a CONSTANT or CALL.
    fn start(&mut self, ins: Instruction<'t>) -> Result<()> {
        let line = ins.line;
        let at = (line, ins.known_kind());
        match ins.body {
            Body::Annotate { .. } => {}
            Body::Constant { name } => {
                let name = self.string(at, "NAME", name)?;
                self.awaiting = Awaiting::Constant { line, name };
            }
            Body::Copy { dst, src } => {
                let (dst, src) = (self.string(at, "DST", dst)?, self.string(at, "SRC", src)?);
                let tensor = self.tensor(line, &src)?;
                self.builder
                    .retain(line, tensor, &format_args!("`{src}`"))?;
                self.bind_new(line, dst, tensor)?;
            }
            Body::CopyFrom { dst, src } => {
                let (dst, src) = (self.string(at, "DST", dst)?, self.string(at, "SRC", src)?);
                let (old, new) = (self.tensor(line, &dst)?, self.tensor(line, &src)?);
                self.builder.del(line, old, &format_args!("`{dst}`"))?;
                self.builder.retain(line, new, &format_args!("`{src}`"))?;
                self.bind(dst, new);
            }
            Body::Release { name } => {
                let name = self.string(at, "NAME", name)?;
                if let Some(&tensor) = self.names.get(&*name) {
                    self.builder.del(line, tensor, &format_args!("`{name}`"))?;
                }
            }
            Body::Call {
                name,
                args,
                result,
                time,
            } => {
                let op = self.string(at, "NAME", name)?;
                let args = self.names_of(at, "ARGS", args)?;
                let results = self.names_of(at, "RESULT", result)?;
                let cost = self.unsigned(at, "TIME", &time)?;
                let inputs = self.inputs(line, &args)?;
                let outputs = SmallVec::with_capacity(results.len());
                self.call_or_wait(Box::new(PendingCall {
                    line,
                    op,
                    args,
                    results,
                    cost,
                    inputs,
                    outputs,
                    memory: None,
                }))?;
            }
            Body::Mutate {
                name,
                args,
                mutate,
                time,
            } => {
                let op = self.string(at, "NAME", name)?;
                let args = self.names_of(at, "ARGS", args)?;
                let cost = self.unsigned(at, "TIME", &time)?;
                let inputs = self.inputs(line, &args)?;
                let mut mutated: SmallVec<[usize; 2]> = SmallVec::new();
                for value in self.list(at, "MUTATE", mutate)? {
                    let index = self.integer(line, "MUTATE", &value)?;
                    match usize::try_from(index).ok().filter(|&k| k < args.len()) {
                        Some(k) => mutated.push(k),
                        None => {
                            return Err(self.fail(
                                line,
                                format!("MUTATE index {index} is not an argument of `{op}`"),
                            ))
                        }
                    }
                }
                self.mutate(line, &op, &args, inputs, &mutated, cost)?;
            }
            Body::Memory { .. } | Body::Alias { .. } => {
                return Err(self.fail(line, format!("{} does not follow a CONSTANT or CALL", at.1)));
            }
            Body::Unknown(other) => {
                return Err(self.fail(line, format!("unknown instruction `{other}`")))
            }
        }
        Ok(())
    }

    /// Adds a CALL's op once every result's lines are read, else waits for
    /// the next ones.
    fn call_or_wait(&mut self, call: Box<PendingCall<'t>>) -> Result<()> {
        if call.outputs.len() < call.results.len() {
            self.awaiting = Awaiting::Call(call);
            return Ok(());
        }
        let PendingCall {
            line,
            op,
            args,
            results,
            cost,
            inputs,
            outputs,
            ..
        } = *call;
        let label = |k: usize| format!("argument `{}` of `{op}`", args[k]);
        let made = self
            .builder
            .apply(line, &op, None, inputs, &outputs, cost, None, &label)?;
        for (name, tensor) in results.into_vec().into_iter().zip(made) {
            self.bind_new(line, name, tensor)?;
        }
        Ok(())
    }

    /// A MUTATE: new tensors, of the mutated arguments' storage sizes,
    /// replace them under their names; the old tensors are released.
    fn mutate(
        &mut self,
        line: usize,
        op: &str,
        args: &[Cow<'t, str>],
        inputs: SmallVec<[TraceTensor; 4]>,
        mutated: &[usize],
        cost: u64,
    ) -> Result<()> {
        let outputs: SmallVec<[_; 2]> = mutated
            .iter()
            .map(|&k| (self.builder.storage_bytes(inputs[k]), None, None))
            .collect();
        let label = |k: usize| format!("argument `{}` of `{op}`", args[k]);
        let made =
            self.builder
                .apply(line, op, None, inputs.clone(), &outputs, cost, None, &label)?;
        for (&k, tensor) in mutated.iter().zip(made) {
            self.builder
                .del(line, inputs[k], &format_args!("`{}`", args[k]))?;
            self.bind(args[k].clone(), tensor);
        }
        Ok(())
    }

    /// After the last line: nothing may still be awaited, and every tensor
    /// still referenced is an output.
    fn finish(mut self) -> Result<Trace> {
        let missing = match &self.awaiting {
            Awaiting::Nothing => None,
            Awaiting::Constant { line, name } => Some((*line, "MEMORY", name.to_string())),
            Awaiting::Call(call) => {
                let kind = if call.memory.is_some() {
                    "ALIAS"
                } else {
                    "MEMORY"
                };
                Some((call.line, kind, call.result().to_string()))
            }
        };
        if let Some((line, kind, name)) = missing {
            return Err(self.fail(
                line,
                format!("expected {kind} for `{name}` after this line, found the end"),
            ));
        }
        let last = self.last_line;
        for name in std::mem::take(&mut self.name_order) {
            let tensor = self.names[&*name];
            if self.builder.refs(tensor) > 0 {
                self.builder
                    .read(last, TraceEvent::Pin { tensor }, &format_args!("`{name}`"))?;
            }
        }
        Ok(self.builder.finish())
    }
}

/// Parses a simrd log; `source` names it in errors (`source:line: …`).
///
/// Lines are imported as they are read. Every line is read before an
/// import error is reported, so that a JSON error on any line wins, as it
/// names the first thing wrong with the file.
pub fn parse(source: &str, text: &str) -> Result<Trace> {
    // The lines of real logs are longer than 32 bytes: an estimate from
    // above, for room that costs nothing until used.
    let mut importer = Importer::new(source, text.len() / 32);
    // The lines before the first `ANNOTATE START`, kept until it comes: a
    // log without one is imported whole.
    let mut before_start = Some(Vec::new());
    let mut failed = None;
    let read = super::lines::read_in_order(text, Instruction::read, |line, body| {
        let ins = Instruction { line, body };
        if let Some(skipped) = &mut before_start {
            if matches!(ins.body, Body::Annotate { start: true }) {
                before_start = None;
            } else {
                skipped.push(ins);
            }
        } else if failed.is_none() {
            failed = importer.step(ins).err();
        }
    });
    if let Err((line, message)) = read {
        return Err(Error::Trace(format!("{source}:{line}: {message}")));
    }
    for ins in before_start.into_iter().flatten() {
        if failed.is_none() {
            failed = importer.step(ins).err();
        }
    }
    match failed {
        Some(error) => Err(error),
        None => importer.finish(),
    }
}
