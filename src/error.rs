//! The crate's error type: every failure a caller can cause or recover from.

use thiserror::Error;

/// Why a request could not be served.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum Error {
    /// The inputs of an op do not fit its shape rules.
    #[error("{op}: {message}")]
    Shape {
        /// The op's name.
        op: String,
        /// What does not fit.
        message: String,
    },

    /// A tensor id that the interpreter does not know (never made, or freed).
    #[error("unknown tensor {0}")]
    UnknownTensor(String),

    /// An argument outside what the call accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No eviction can make room for an allocation. The interpreter is left
    /// consistent; raising the budget and retrying the call may succeed.
    #[error(
        "out of memory: {context} needs {requested_bytes} B{} but the budget is {budget_bytes} B \
         with {in_use_bytes} B in use ({} B free{}), of which {locked_bytes} B is locked by the \
         running op and {pinned_bytes} B is pinned or not recomputable; {}{}{}",
        aligned_note(*requested_bytes, *aligned_bytes),
        budget_bytes.saturating_sub(*in_use_bytes),
        largest_free_note(*largest_free_bytes),
        evictable_note(in_use_bytes.saturating_sub(locked_bytes.saturating_add(*pinned_bytes))),
        chain_note(chain),
        locked_note(largest_locked)
    )]
    OutOfMemory {
        /// What asked for memory: an op (saying whether it ran to rematerialise) or a put.
        context: String,
        /// Bytes the allocation needed.
        requested_bytes: u64,
        /// The same rounded up to the arena's alignment, block by block
        /// (`requested_bytes` when memory counts bytes).
        aligned_bytes: u64,
        /// The budget in bytes (`u64::MAX` when unbounded).
        budget_bytes: u64,
        /// Bytes in use when it failed.
        in_use_bytes: u64,
        /// Of those, bytes of storages locked by running or pending ops.
        locked_bytes: u64,
        /// Of those, the other bytes no eviction can free: pinned storages,
        /// and ones that cannot be recomputed (puts, detached tensors).
        pinned_bytes: u64,
        /// In an arena, its largest free block: when the free bytes would
        /// hold the request, no single block did (fragmentation).
        largest_free_bytes: Option<u64>,
        /// When the op was run to (re)compute an input of others: those ops,
        /// innermost first, the last the one the program asked for (empty
        /// when the op is the program's own).
        chain: Vec<String>,
        /// The largest storages locked at the time, largest first: what
        /// each holds and its bytes.
        largest_locked: Vec<(String, u64)>,
    },

    /// Rematerialisation cost more than the configured limit; the run was
    /// stopped there, leaving the interpreter consistent.
    #[error("thrashing: rematerialisation cost {remat_compute} exceeds the limit of {limit}")]
    Thrash {
        /// Cost units the budget has cost so far: recomputation, and any
        /// swap stalls and block moves.
        remat_compute: u64,
        /// The configured limit, in cost units.
        limit: u64,
    },

    /// A backend failed to run an op (data-dependent errors such as an index
    /// out of range, or a device error).
    #[error("backend {backend}: {message}")]
    Backend {
        /// The backend's name (`"cpu"`, `"wgpu"`).
        backend: &'static str,
        /// What failed.
        message: String,
    },

    /// A trace that cannot be read or replayed: `file:line: what is wrong`.
    #[error("{0}")]
    Trace(String),

    /// A file that could not be read, written or made sense of.
    #[error("{path}: {message}")]
    Io {
        /// The file that failed.
        path: std::path::PathBuf,
        /// The cause, as the system or the parser gave it.
        message: String,
    },

    /// A policy name that is not in the registry.
    #[error("unknown heuristic `{name}`; known: {known}")]
    UnknownHeuristic {
        /// The name asked for.
        name: String,
        /// The registered names, comma-separated.
        known: String,
    },
}

/// `Result` with this crate's [`Error`](enum@Error) as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// ` (N B aligned)` where the arena's alignment made the request larger.
fn aligned_note(requested: u64, aligned: u64) -> String {
    if aligned == requested {
        String::new()
    } else {
        format!(" ({aligned} B aligned)")
    }
}

/// `, the largest block N B` in an arena, where the free bytes are scattered.
fn largest_free_note(largest_free: Option<u64>) -> String {
    largest_free.map_or(String::new(), |bytes| {
        format!(", the largest block {bytes} B")
    })
}

/// What eviction could still free, which was not enough.
fn evictable_note(evictable: u64) -> String {
    match evictable {
        0 => "nothing is left to evict".to_string(),
        _ => format!("evicting the other {evictable} B would not make room"),
    }
}

/// `; ops waiting on it, innermost first: `b`, `c``, or nothing.
fn chain_note(chain: &[String]) -> String {
    if chain.is_empty() {
        return String::new();
    }
    let ops: Vec<String> = chain.iter().map(|op| format!("`{op}`")).collect();
    format!("; ops waiting on it, innermost first: {}", ops.join(", "))
}

/// `; the largest locked storages: 64 B (output of `exp`), …`, or nothing.
fn locked_note(locked: &[(String, u64)]) -> String {
    if locked.is_empty() {
        return String::new();
    }
    let list: Vec<String> = locked
        .iter()
        .map(|(what, bytes)| format!("{bytes} B ({what})"))
        .collect();
    format!("; the largest locked storages: {}", list.join(", "))
}

impl Error {
    pub(crate) fn shape(op: String, message: impl Into<String>) -> Error {
        Error::Shape {
            op,
            message: message.into(),
        }
    }

    pub(crate) fn backend(backend: &'static str, message: impl Into<String>) -> Error {
        Error::Backend {
            backend,
            message: message.into(),
        }
    }

    /// A file that could not be read, written or parsed, named with the cause.
    pub fn file(path: &std::path::Path, cause: impl std::fmt::Display) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            message: cause.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_errors_are_io_errors_naming_the_path() {
        let error = Error::file(std::path::Path::new("/no/such/dir"), "permission denied");
        assert!(matches!(error, Error::Io { .. }), "{error:?}");
        assert_eq!(error.to_string(), "/no/such/dir: permission denied");
    }

    #[test]
    fn out_of_memory_names_the_waiting_ops_the_free_bytes_and_the_locked_storages() {
        let error = Error::OutOfMemory {
            context: "op `exp`, rerun to rematerialise an evicted tensor,".into(),
            requested_bytes: 16,
            aligned_bytes: 16,
            budget_bytes: 64,
            in_use_bytes: 56,
            locked_bytes: 32,
            pinned_bytes: 24,
            largest_free_bytes: None,
            chain: vec!["add".into(), "matmul".into()],
            largest_locked: vec![("output of `exp`".into(), 32)],
        };
        let text = error.to_string();
        for part in [
            "needs 16 B but the budget is 64 B with 56 B in use (8 B free)",
            "ops waiting on it, innermost first: `add`, `matmul`",
            "the largest locked storages: 32 B (output of `exp`)",
            "nothing is left to evict",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
    }

    /// Eviction stops before it starts where evicting every candidate
    /// would not make room: the message says how much that was.
    #[test]
    fn out_of_memory_names_what_eviction_could_still_free() {
        let error = Error::OutOfMemory {
            context: "op `exp`".into(),
            requested_bytes: 40,
            aligned_bytes: 40,
            budget_bytes: 64,
            in_use_bytes: 56,
            locked_bytes: 32,
            pinned_bytes: 8,
            largest_free_bytes: None,
            chain: Vec::new(),
            largest_locked: Vec::new(),
        };
        let text = error.to_string();
        assert!(
            text.ends_with("evicting the other 16 B would not make room"),
            "{text}"
        );
    }
}
