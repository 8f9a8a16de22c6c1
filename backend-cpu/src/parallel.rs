//! Splitting an op's work over the backend's thread pool.
//!
//! Ops run inside the pool (`ThreadPool::install`), so rayon's parallel iterators use its
//! threads. Small work runs on the calling thread: a decode step is hundreds of tiny ops, and
//! waking the pool for each would cost more than the op.

use std::ops::Range;

use rayon::prelude::*;
use tessera_core::Result;

/// Work (roughly, multiply-adds) below which an op does not split across threads.
const MIN_PARALLEL_WORK: usize = 1 << 15;

/// Runs `f` over `0..n` in contiguous ranges, on several threads when `n * cost` (the
/// estimated work of all items) is worth it. Stops at the first error.
pub(crate) fn for_ranges<F>(n: usize, cost: usize, f: F) -> Result<()>
where
    F: Fn(Range<usize>) -> Result<()> + Sync,
{
    let threads = rayon::current_num_threads();
    let total = n.saturating_mul(cost.max(1));
    if threads <= 1 || n <= 1 || total < MIN_PARALLEL_WORK {
        return f(0..n);
    }
    // Several pieces per thread balance uneven items and busy cores, but no piece is tiny.
    let pieces = n
        .min(threads * 8)
        .min((total / (MIN_PARALLEL_WORK / 4)).max(threads));
    let step = n.div_ceil(pieces);
    (0..n.div_ceil(step))
        .into_par_iter()
        .try_for_each(|p| f(p * step..((p + 1) * step).min(n)))
}

/// Calls `f(row, chunk)` for each `row_len`-long chunk of `data` (a scratch matrix being
/// filled), on several threads when the work (`cost` per chunk) is worth it.
pub(crate) fn for_rows_mut<T, F>(data: &mut [T], row_len: usize, cost: usize, f: F) -> Result<()>
where
    T: Send,
    F: Fn(usize, &mut [T]) -> Result<()> + Sync,
{
    let n = data.len() / row_len.max(1);
    let threads = rayon::current_num_threads();
    if row_len == 0 || threads <= 1 || n <= 1 || n.saturating_mul(cost) < MIN_PARALLEL_WORK {
        return data
            .chunks_mut(row_len.max(1))
            .enumerate()
            .try_for_each(|(r, c)| f(r, c));
    }
    let min_len = (MIN_PARALLEL_WORK / 4 / cost.max(1)).max(1);
    data.par_chunks_mut(row_len)
        .enumerate()
        .with_min_len(min_len)
        .try_for_each(|(r, c)| f(r, c))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn every_item_runs_once() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for n in [0, 1, 7, 1000, 100_000] {
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.install(|| {
                for_ranges(n, 100, |r| {
                    for i in r {
                        seen[i].fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .unwrap();
            assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
        }
    }
}
