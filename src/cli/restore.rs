//! `--restore`, `--swap-bandwidth` and `--host-memory`: how evicted
//! storages come back, shared by the commands that replay.

use dtr::{RestoreMode, SwapConfig};

use super::parse_bytes;

/// How evicted storages come back.
#[derive(clap::Args, Debug, Clone)]
pub struct RestoreArgs {
    /// `drop` recomputes evicted tensors (DTR); `swap` copies them to host
    /// memory and back; `hybrid` picks per tensor whichever the estimates
    /// make cheaper.
    #[arg(long, value_enum, default_value = "drop")]
    pub restore: RestoreMode,
    /// Bytes per second of the copy queue between device and host, each
    /// way (costs are taken as nanoseconds); with `swap` and `hybrid`.
    #[arg(long, default_value = "16GB", value_parser = parse_bytes)]
    pub swap_bandwidth: u64,
    /// The most bytes host copies may hold at once (default: no limit).
    #[arg(long, value_parser = parse_bytes)]
    pub host_memory: Option<u64>,
}

impl RestoreArgs {
    pub fn swap(&self) -> SwapConfig {
        SwapConfig {
            bandwidth: self.swap_bandwidth as f64,
            host_memory: self.host_memory,
        }
    }
}
