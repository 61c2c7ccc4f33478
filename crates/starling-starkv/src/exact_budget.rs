//! The final exact-budget step every rank strategy ends with, and the uniform allocation built
//! on it. A leaf module: the strategies (`allocation`, `threshold`) both use it and it uses
//! neither, so they import no circle.
//!
//! Rounding rule: ranks are first clamped to `[1, max]`; then, while the total is below the
//! target, the not-yet-kept component with the highest value is added (the next component of
//! some factor); while above, the kept component with the lowest value is dropped (the last
//! component of some factor, never below rank 1). Ties go to the lowest factor index
//! (canonical order). Each move changes the total by exactly one element, so the total ends
//! equal to the target; feasibility (`Σ 1 ≤ target ≤ Σ max`) is checked first.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::StarKvError;

/// `f64` ordered by `total_cmp`, so values can sit in a heap.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ordered(f64);

impl Eq for Ordered {}

impl PartialOrd for Ordered {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ordered {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Moves `ranks` (one per factor, each at most `max_ranks[i]`) to sum exactly to `target` by
/// the rule in the module docs. `value(factor, component)` is the worth of keeping component
/// `component` (0-based) of `factor`.
pub(crate) fn meet_budget(
    ranks: &mut [usize],
    max_ranks: &[usize],
    target: u64,
    value: &dyn Fn(usize, usize) -> f64,
) -> Result<(), StarKvError> {
    if ranks.len() != max_ranks.len() {
        return Err(StarKvError::SizeMismatch {
            what: "ranks vs maximum ranks".to_owned(),
            expected: max_ranks.len(),
            found: ranks.len(),
        });
    }
    let min_total = ranks.len() as u64;
    let max_total: u64 = max_ranks.iter().map(|&m| m as u64).sum();
    if target < min_total || target > max_total || max_ranks.contains(&0) {
        return Err(StarKvError::BudgetInfeasible(format!(
            "{target} elements cannot be split over {} factors of rank 1 to their maximum \
             (total {min_total}..={max_total})",
            ranks.len()
        )));
    }
    for (rank, &max) in ranks.iter_mut().zip(max_ranks) {
        *rank = (*rank).clamp(1, max);
    }
    let mut total: u64 = ranks.iter().map(|&r| r as u64).sum();
    if total < target {
        // Max-heap on the next component's value; `Reverse(index)` breaks ties to the lowest.
        let mut heap: BinaryHeap<(Ordered, Reverse<usize>)> = ranks
            .iter()
            .enumerate()
            .filter(|&(i, &r)| r < max_ranks[i])
            .map(|(i, &r)| (Ordered(value(i, r)), Reverse(i)))
            .collect();
        while total < target {
            let Some((_, Reverse(i))) = heap.pop() else {
                break;
            };
            ranks[i] += 1;
            total += 1;
            if ranks[i] < max_ranks[i] {
                heap.push((Ordered(value(i, ranks[i])), Reverse(i)));
            }
        }
    } else if total > target {
        // Min-heap on the last kept component's value, ties to the lowest index.
        let mut heap: BinaryHeap<Reverse<(Ordered, usize)>> = ranks
            .iter()
            .enumerate()
            .filter(|&(_, &r)| r > 1)
            .map(|(i, &r)| Reverse((Ordered(value(i, r - 1)), i)))
            .collect();
        while total > target {
            let Some(Reverse((_, i))) = heap.pop() else {
                break;
            };
            ranks[i] -= 1;
            total -= 1;
            if ranks[i] > 1 {
                heap.push(Reverse((Ordered(value(i, ranks[i] - 1)), i)));
            }
        }
    }
    debug_assert_eq!(total, target, "feasibility was checked above");
    Ok(())
}

/// `⌊max_i · target / Σ max⌋` per factor, then the exact step adding to (removing from) the
/// factor whose kept share of its maximum rank is lowest (highest), so shares differ by at
/// most one component.
pub(crate) fn uniform_ranks(max_ranks: &[usize], target: u64) -> Result<Vec<usize>, StarKvError> {
    let max_total: u64 = max_ranks.iter().map(|&m| m as u64).sum();
    let mut ranks: Vec<usize> = max_ranks
        .iter()
        .map(|&m| (m as u64 * target / max_total.max(1)) as usize)
        .collect();
    let share = |f: usize, c: usize| -((c + 1) as f64) / max_ranks[f] as f64;
    meet_budget(&mut ranks, max_ranks, target, &share)?;
    Ok(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_most_valuable_and_drops_the_least_valuable_components() {
        // Factor 0's components are worth 10, 9, 8…; factor 1's 5, 4, 3….
        let value = |f: usize, c: usize| {
            if f == 0 {
                10.0 - c as f64
            } else {
                5.0 - c as f64
            }
        };
        let mut ranks = vec![1, 1];
        meet_budget(&mut ranks, &[8, 8], 9, &value).unwrap();
        // Adds factor 0's 9, 8, 7, 6, 5, then its 4 (tied with factor 1's 4: the lower index
        // wins), then factor 1's 4.
        assert_eq!(ranks, vec![7, 2]);

        // From full rank, dropping the cheapest last components reaches the same split.
        let mut ranks = vec![8, 8];
        meet_budget(&mut ranks, &[8, 8], 9, &value).unwrap();
        assert_eq!(ranks, vec![7, 2]);
    }

    #[test]
    fn clamps_first_and_refuses_infeasible_targets() {
        let value = |_: usize, _: usize| 1.0;
        let mut ranks = vec![0, 20];
        meet_budget(&mut ranks, &[4, 4], 5, &value).unwrap();
        assert_eq!(ranks.iter().sum::<usize>(), 5);
        assert!(ranks.iter().all(|&r| (1..=4).contains(&r)));
        assert!(meet_budget(&mut ranks, &[4, 4], 1, &value).is_err());
        assert!(meet_budget(&mut ranks, &[4, 4], 9, &value).is_err());
        assert!(meet_budget(&mut ranks, &[4], 2, &value).is_err());
    }
}
