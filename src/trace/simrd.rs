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

use std::collections::HashMap;

use serde_json::Value;
use smallvec::SmallVec;

use super::{Trace, TraceBuilder, TraceEvent, TraceTensor};
use crate::error::{Error, Result};

/// One parsed line: its number and object.
struct Instruction {
    line: usize,
    object: serde_json::Map<String, Value>,
}

impl Instruction {
    fn kind(&self) -> &str {
        self.object
            .get("INSTRUCTION")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

struct Importer<'a> {
    source: &'a str,
    builder: TraceBuilder,
    /// Name → tensor; a name keeps its first position when rebound.
    names: HashMap<String, TraceTensor>,
    name_order: Vec<String>,
}

impl Importer<'_> {
    fn fail(&self, line: usize, message: impl std::fmt::Display) -> Error {
        Error::Trace(format!("{}:{line}: {message}", self.source))
    }

    fn field<'v>(&self, instruction: &'v Instruction, key: &str) -> Result<&'v Value> {
        instruction.object.get(key).ok_or_else(|| {
            self.fail(
                instruction.line,
                format!("{} is missing field `{key}`", instruction.kind()),
            )
        })
    }

    fn string(&self, instruction: &Instruction, key: &str) -> Result<String> {
        match self.field(instruction, key)? {
            Value::String(s) => Ok(s.clone()),
            other => Err(self.fail(
                instruction.line,
                format!("`{key}` must be a string, got {other}"),
            )),
        }
    }

    /// A decimal string or a JSON number.
    fn integer(&self, line: usize, key: &str, value: &Value) -> Result<i64> {
        let parsed = match value {
            Value::String(s) => s.trim().parse::<i64>().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        };
        parsed.ok_or_else(|| self.fail(line, format!("`{key}` must be an integer, got {value}")))
    }

    fn unsigned(&self, instruction: &Instruction, key: &str) -> Result<u64> {
        let value = self.integer(instruction.line, key, self.field(instruction, key)?)?;
        u64::try_from(value).map_err(|_| {
            self.fail(
                instruction.line,
                format!("`{key}` must not be negative, got {value}"),
            )
        })
    }

    fn list<'v>(&self, instruction: &'v Instruction, key: &str) -> Result<&'v Vec<Value>> {
        match self.field(instruction, key)? {
            Value::Array(items) => Ok(items),
            other => Err(self.fail(
                instruction.line,
                format!("`{key}` must be a list, got {other}"),
            )),
        }
    }

    fn names_of(&self, instruction: &Instruction, key: &str) -> Result<Vec<String>> {
        self.list(instruction, key)?
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(self.fail(
                    instruction.line,
                    format!("`{key}` must list names, got {other}"),
                )),
            })
            .collect()
    }

    fn tensor(&self, line: usize, name: &str) -> Result<TraceTensor> {
        self.names
            .get(name)
            .copied()
            .ok_or_else(|| self.fail(line, format!("unknown tensor `{name}`")))
    }

    fn bind(&mut self, name: String, tensor: TraceTensor) {
        if self.names.insert(name.clone(), tensor).is_none() {
            self.name_order.push(name);
        }
    }

    fn bind_new(&mut self, line: usize, name: String, tensor: TraceTensor) -> Result<()> {
        if self.names.contains_key(&name) {
            return Err(self.fail(line, format!("tensor `{name}` is defined twice")));
        }
        self.bind(name, tensor);
        Ok(())
    }

    /// The next instruction, which must be `kind` and name `name`.
    fn expect<'i>(
        &self,
        after: usize,
        next: Option<&'i Instruction>,
        kind: &str,
        name: &str,
    ) -> Result<&'i Instruction> {
        let Some(next) = next else {
            return Err(self.fail(
                after,
                format!("expected {kind} for `{name}` after this line, found the end"),
            ));
        };
        if next.kind() != kind {
            return Err(self.fail(
                next.line,
                format!("expected {kind} for `{name}`, found {}", next.kind()),
            ));
        }
        let found = self.string(next, "NAME")?;
        if found != name {
            return Err(self.fail(
                next.line,
                format!("{kind} names `{found}`, expected `{name}`"),
            ));
        }
        Ok(next)
    }

    fn run(&mut self, instructions: &[Instruction]) -> Result<()> {
        let mut i = 0;
        while i < instructions.len() {
            let ins = &instructions[i];
            let line = ins.line;
            i += 1;
            match ins.kind() {
                "ANNOTATE" => {}
                "CONSTANT" => {
                    let name = self.string(ins, "NAME")?;
                    let memory = self.expect(line, instructions.get(i), "MEMORY", &name)?;
                    i += 1;
                    let bytes = self.unsigned(memory, "MEMORY")?;
                    let tensor = self.builder.put(line, bytes, None, None)?;
                    self.bind_new(line, name, tensor)?;
                }
                "COPY" => {
                    let (dst, src) = (self.string(ins, "DST")?, self.string(ins, "SRC")?);
                    let tensor = self.tensor(line, &src)?;
                    self.builder.retain(line, tensor, &format!("`{src}`"))?;
                    self.bind_new(line, dst, tensor)?;
                }
                "COPY_FROM" => {
                    let (dst, src) = (self.string(ins, "DST")?, self.string(ins, "SRC")?);
                    let (old, new) = (self.tensor(line, &dst)?, self.tensor(line, &src)?);
                    self.builder.del(line, old, &format!("`{dst}`"))?;
                    self.builder.retain(line, new, &format!("`{src}`"))?;
                    self.bind(dst, new);
                }
                "RELEASE" => {
                    let name = self.string(ins, "NAME")?;
                    if let Some(&tensor) = self.names.get(&name) {
                        self.builder.del(line, tensor, &format!("`{name}`"))?;
                    }
                }
                "CALL" => i = self.call(ins, instructions, i)?,
                "MUTATE" => self.mutate(ins)?,
                "MEMORY" | "ALIAS" => {
                    return Err(self.fail(
                        line,
                        format!("{} does not follow a CONSTANT or CALL", ins.kind()),
                    ));
                }
                other => return Err(self.fail(line, format!("unknown instruction `{other}`"))),
            }
        }
        // Every tensor still referenced is an output.
        let last = instructions.last().map_or(0, |ins| ins.line);
        for name in std::mem::take(&mut self.name_order) {
            let tensor = self.names[&name];
            if self.builder.refs(tensor) > 0 {
                self.builder
                    .read(last, TraceEvent::Pin { tensor }, &format!("`{name}`"))?;
            }
        }
        Ok(())
    }

    /// A CALL and its MEMORY/ALIAS lines; returns the index after them.
    fn call(
        &mut self,
        ins: &Instruction,
        instructions: &[Instruction],
        mut i: usize,
    ) -> Result<usize> {
        let line = ins.line;
        let op = self.string(ins, "NAME")?;
        let args = self.names_of(ins, "ARGS")?;
        let results = self.names_of(ins, "RESULT")?;
        let cost = self.unsigned(ins, "TIME")?;
        let inputs: SmallVec<[TraceTensor; 4]> = args
            .iter()
            .map(|a| self.tensor(line, a))
            .collect::<Result<_>>()?;
        let mut outputs = Vec::with_capacity(results.len());
        for result in &results {
            let memory = self.expect(line, instructions.get(i), "MEMORY", result)?;
            let alias = self.expect(line, instructions.get(i + 1), "ALIAS", result)?;
            i += 2;
            let bytes = self.unsigned(memory, "MEMORY")?;
            let alias_of = match self.integer(alias.line, "ALIAS", self.field(alias, "ALIAS")?)? {
                -1 => None,
                index if index >= 0 => Some(index as usize),
                index => {
                    return Err(self.fail(
                        alias.line,
                        format!("ALIAS must be -1 or an argument index, got {index}"),
                    ))
                }
            };
            outputs.push((if alias_of.is_some() { 0 } else { bytes }, alias_of, None));
        }
        let label = |k: usize| format!("argument `{}` of `{op}`", args[k]);
        let made =
            self.builder
                .apply(line, op.clone(), None, inputs, &outputs, cost, None, &label)?;
        for (name, tensor) in results.into_iter().zip(made) {
            self.bind_new(line, name, tensor)?;
        }
        Ok(i)
    }

    /// A MUTATE: new tensors, of the mutated arguments' storage sizes,
    /// replace them under their names; the old tensors are released.
    fn mutate(&mut self, ins: &Instruction) -> Result<()> {
        let line = ins.line;
        let op = self.string(ins, "NAME")?;
        let args = self.names_of(ins, "ARGS")?;
        let cost = self.unsigned(ins, "TIME")?;
        let inputs: SmallVec<[TraceTensor; 4]> = args
            .iter()
            .map(|a| self.tensor(line, a))
            .collect::<Result<_>>()?;
        let mut mutated = Vec::new();
        for value in self.list(ins, "MUTATE")? {
            let index = self.integer(line, "MUTATE", value)?;
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
        let outputs: Vec<_> = mutated
            .iter()
            .map(|&k| (self.builder.storage_bytes(inputs[k]), None, None))
            .collect();
        let label = |k: usize| format!("argument `{}` of `{op}`", args[k]);
        let made = self.builder.apply(
            line,
            op.clone(),
            None,
            inputs.clone(),
            &outputs,
            cost,
            None,
            &label,
        )?;
        for (&k, tensor) in mutated.iter().zip(made) {
            self.builder
                .del(line, inputs[k], &format!("`{}`", args[k]))?;
            self.bind(args[k].clone(), tensor);
        }
        Ok(())
    }
}

/// Parses a simrd log; `source` names it in errors (`source:line: …`).
pub fn parse(source: &str, text: &str) -> Result<Trace> {
    let mut instructions = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(object)) => instructions.push(Instruction { line, object }),
            Ok(other) => {
                return Err(Error::Trace(format!(
                    "{source}:{line}: expected a JSON object, got {other}"
                )))
            }
            Err(e) => return Err(Error::Trace(format!("{source}:{line}: {e}"))),
        }
    }
    let is_start = |ins: &Instruction| {
        ins.kind() == "ANNOTATE"
            && ins.object.get("ANNOTATION").and_then(Value::as_str) == Some("START")
    };
    let start = instructions.iter().position(is_start).map_or(0, |p| p + 1);
    let mut importer = Importer {
        source,
        builder: TraceBuilder::new(source),
        names: HashMap::new(),
        name_order: Vec::new(),
    };
    importer.run(&instructions[start..])?;
    Ok(importer.builder.finish())
}
