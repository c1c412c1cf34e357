//! The optimal checkpointing schedule for a uniform chain (Griewank's
//! Revolve): the fewest forward steps that reverse a chain of `l` steps with
//! `s` checkpoint slots. The baseline DTR runs on chains are compared with.

/// `C(n, k)`, saturating at `u64::MAX`.
fn binomial(n: u64, k: u64) -> u64 {
    let k = k.min(n.saturating_sub(k));
    let mut result: u128 = 1;
    for i in 0..k {
        result = result * (n - i) as u128 / (i + 1) as u128;
        if result > u64::MAX as u128 {
            return u64::MAX;
        }
    }
    result as u64
}

/// Forward steps of the optimal reversal, in closed form: with `r` the
/// smallest integer such that `C(s + r, s) ≥ l`, it is `r·l − C(s + r, s + 1)`.
/// `None` without a slot (`s = 0`) for chains longer than one step.
pub fn forward_steps(l: u64, s: u64) -> Option<u64> {
    if l <= 1 {
        return Some(0);
    }
    if s == 0 {
        return None;
    }
    let mut r = 0;
    while binomial(s + r, s) < l {
        r += 1;
    }
    Some(r * l - binomial(s + r, s + 1))
}

/// The same by its recurrence: F(1, s) = 0, F(l, 1) = l(l−1)/2,
/// F(l, s) = min over 1 ≤ j < l of j + F(l−j, s−1) + F(j, s).
/// O(l²·s): for checking the closed form, not for large chains.
pub fn forward_steps_by_recurrence(l: usize, s: usize) -> Option<u64> {
    if l <= 1 {
        return Some(0);
    }
    if s == 0 {
        return None;
    }
    // table[s][l]
    let mut table = vec![vec![0u64; l + 1]; s + 1];
    for (n, steps) in table[1].iter_mut().enumerate().skip(1) {
        *steps = (n as u64) * (n as u64 - 1) / 2;
    }
    for slots in 2..=s {
        for n in 2..=l {
            table[slots][n] = (1..n)
                .map(|j| j as u64 + table[slots - 1][n - j] + table[slots][j])
                .min()
                .unwrap_or(0);
        }
    }
    Some(table[s][l])
}

/// Forward steps beyond the `l − 1` of a single unbounded forward pass.
pub fn extra_steps(l: u64, s: u64) -> Option<u64> {
    forward_steps(l, s).map(|f| f.saturating_sub(l.saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_for_three_slots() {
        assert_eq!(forward_steps(10, 3), Some(15));
        assert_eq!(forward_steps(20, 3), Some(45));
        assert_eq!(forward_steps(56, 3), Some(210));
    }

    #[test]
    fn closed_form_equals_the_recurrence() {
        for s in 1..6 {
            for l in 1..60 {
                assert_eq!(
                    forward_steps(l as u64, s as u64),
                    forward_steps_by_recurrence(l, s),
                    "l = {l}, s = {s}"
                );
            }
        }
    }

    #[test]
    fn one_slot_recomputes_from_the_start_and_many_slots_cost_nothing_extra() {
        assert_eq!(forward_steps(10, 1), Some(45));
        assert_eq!(extra_steps(10, 9), Some(0));
        assert_eq!(forward_steps(5, 0), None);
    }
}
