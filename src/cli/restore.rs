//! `--swap-bandwidth` and `--host-memory`: the copy queue and host memory
//! that `--restore swap|hybrid` use; `--move-bandwidth`, what moving blocks
//! in `--memory arena-compact` costs. Shared by the commands that replay.

use dtr::SwapConfig;

use super::parse_bytes;

/// The host side of swapping.
#[derive(clap::Args, Debug, Clone)]
pub struct SwapArgs {
    /// Bytes per second of the copy queues between device and host, each
    /// way (costs are taken as nanoseconds); with `--restore swap|hybrid`.
    #[arg(long, default_value = "16GB", value_parser = parse_bytes)]
    pub swap_bandwidth: u64,
    /// The most bytes host copies may hold at once (default: no limit).
    #[arg(long, value_parser = parse_bytes)]
    pub host_memory: Option<u64>,
    /// Bytes per second that `--memory arena-compact` moves blocks at, on
    /// the compute stream (a device-to-device copy; costs are taken as
    /// nanoseconds).
    #[arg(long, default_value = "300GB", value_parser = parse_bytes)]
    pub move_bandwidth: u64,
}

impl SwapArgs {
    pub fn config(&self) -> SwapConfig {
        SwapConfig {
            bandwidth: self.swap_bandwidth as f64,
            host_memory: self.host_memory,
        }
    }

    /// `--move-bandwidth`, in bytes per second.
    pub fn move_bandwidth(&self) -> f64 {
        self.move_bandwidth as f64
    }
}

/// The help of `--restore`.
pub const RESTORE_HELP: &str = "How evicted tensors come back: `drop` recomputes them (DTR); `swap` \
copies them to host memory and back; `hybrid` picks per tensor whichever the estimates make cheaper. \
Under both, tensors that cannot be recomputed (parameters, optimiser state, gradients) may be \
swapped too";
