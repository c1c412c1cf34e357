//! The crate's error type: every failure a caller can cause or recover from.

use thiserror::Error;

/// Why a request could not be served.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum Error {
    /// The inputs of an op do not fit its shape rules.
    #[error("{op}: {message}")]
    Shape { op: String, message: String },

    /// A tensor id that the interpreter does not know (never made, or freed).
    #[error("unknown tensor {0}")]
    UnknownTensor(String),

    /// An argument outside what the call accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No eviction can make room for an allocation. The interpreter is left
    /// consistent; raising the budget and retrying the call may succeed.
    #[error(
        "out of memory: {context} needs {requested_bytes} B but the budget is {budget_bytes} B \
         with {in_use_bytes} B in use, of which {locked_bytes} B is locked by the running op \
         and {pinned_bytes} B is pinned or not recomputable; nothing is left to evict"
    )]
    OutOfMemory {
        context: String,
        requested_bytes: u64,
        budget_bytes: u64,
        in_use_bytes: u64,
        locked_bytes: u64,
        pinned_bytes: u64,
    },

    /// Rematerialisation cost more than the configured limit; the run was
    /// stopped there, leaving the interpreter consistent.
    #[error("thrashing: rematerialisation cost {remat_compute} exceeds the limit of {limit}")]
    Thrash { remat_compute: u64, limit: u64 },

    /// A backend failed to run an op (data-dependent errors such as an index
    /// out of range, or a device error).
    #[error("backend {backend}: {message}")]
    Backend {
        backend: &'static str,
        message: String,
    },

    /// A trace that cannot be read or replayed: `file:line: what is wrong`.
    #[error("{0}")]
    Trace(String),

    /// A file that could not be read, written or made sense of.
    #[error("{path}: {message}")]
    Io {
        path: std::path::PathBuf,
        message: String,
    },

    /// A policy name that is not in the registry.
    #[error("unknown heuristic `{name}`; known: {known}")]
    UnknownHeuristic { name: String, known: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
}
