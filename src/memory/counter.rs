//! Memory accounting against the budget.

/// Bytes in use against an optional budget, with the high-water mark.
#[derive(Debug, Clone, Default)]
pub struct MemoryCounter {
    budget_bytes: Option<u64>,
    in_use_bytes: u64,
    peak_bytes: u64,
}

impl MemoryCounter {
    pub(crate) fn new(budget_bytes: Option<u64>) -> MemoryCounter {
        MemoryCounter {
            budget_bytes,
            ..MemoryCounter::default()
        }
    }

    /// The budget (`None`: unbounded).
    pub fn budget_bytes(&self) -> Option<u64> {
        self.budget_bytes
    }

    pub(crate) fn set_budget_bytes(&mut self, budget_bytes: Option<u64>) {
        self.budget_bytes = budget_bytes;
    }

    /// Bytes allocated now.
    pub fn in_use_bytes(&self) -> u64 {
        self.in_use_bytes
    }

    /// The most bytes allocated at once.
    pub fn peak_bytes(&self) -> u64 {
        self.peak_bytes
    }

    /// Whether `bytes` more would stay within the budget.
    pub fn fits(&self, bytes: u64) -> bool {
        self.budget_bytes
            .is_none_or(|budget| self.in_use_bytes.saturating_add(bytes) <= budget)
    }

    pub(crate) fn allocate(&mut self, bytes: u64) {
        self.in_use_bytes = self.in_use_bytes.saturating_add(bytes);
        self.peak_bytes = self.peak_bytes.max(self.in_use_bytes);
    }

    pub(crate) fn free(&mut self, bytes: u64) {
        debug_assert!(bytes <= self.in_use_bytes, "freeing more than is in use");
        self.in_use_bytes -= bytes;
    }
}
