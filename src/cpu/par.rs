//! Parallel loops that stay on the calling thread when the work is small.
//!
//! A parallel loop started from outside rayon's pool hands its jobs to the pool's threads and
//! sleeps until they are done: two thread wake-ups, which cost more than the whole arithmetic
//! of a small attention forward pass, and several times more once the pool's threads have gone
//! back to sleep (`docs/benchmarks.md`). Below [`SERIAL_BELOW`] the kernels run their tasks
//! in order on the calling thread instead, and with one rayon thread they always do (that
//! thread would only be woken to run what the caller could). The tasks are the same either way
//! and write disjoint outputs, so the results are identical.

use rayon::prelude::*;

/// Multiply-adds below which a kernel's tasks run on the calling thread: on one core they take
/// about as long as a fork-join costs (see above).
pub(crate) const SERIAL_BELOW: usize = 1 << 21;

/// Whether `work` multiply-adds are worth the pool: at least [`SERIAL_BELOW`], and more
/// than one rayon thread.
pub(crate) fn parallel(work: usize) -> bool {
    #[cfg(test)]
    if let Some(forced) = FORCED.with(|f| f.get()) {
        return forced;
    }
    work >= serial_below() && rayon::current_num_threads() > 1
}

/// [`parallel`] for a memory-bound pass over `elements` elements (a fill, a sum of rows):
/// each costs about as long as 4 multiply-adds of a product (memory traffic, not arithmetic,
/// bounds it, even with the data in cache), so such a pass goes to the pool from 2¹⁹
/// elements.
pub(crate) fn parallel_pass(elements: usize) -> bool {
    parallel(elements.saturating_mul(4))
}

#[cfg(test)]
thread_local! {
    static FORCED: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Tests only: [`parallel`]'s answer on this thread (`None`: by the work again).
#[cfg(test)]
pub(crate) fn force(parallel: Option<bool>) {
    FORCED.with(|f| f.set(parallel));
}

/// [`SERIAL_BELOW`], or 0 with the `force-parallel` feature (tests: every pass and product on
/// rayon's pool, however small).
fn serial_below() -> usize {
    match cfg!(feature = "force-parallel") {
        true => 0,
        false => SERIAL_BELOW,
    }
}

/// `f(state, task)` for every task in `0..count`: on rayon's threads (one `state` from `init`
/// per job, as `for_each_init`) when `parallel`, else in order on the calling thread with one
/// `state`.
pub(crate) fn for_each_init<S, I, F>(count: usize, parallel: bool, init: I, f: F)
where
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize) + Sync + Send,
{
    if parallel {
        (0..count).into_par_iter().for_each_init(init, f)
    } else {
        let mut state = init();
        (0..count).for_each(|task| f(&mut state, task))
    }
}

/// `f(index, piece)` for every `chunk`-element piece of `data` (the last may be shorter): on
/// rayon's threads when `parallel`, else in order on the calling thread.
pub(crate) fn for_each_chunk_mut<T, F>(data: &mut [T], chunk: usize, parallel: bool, f: F)
where
    T: Send,
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    match parallel {
        true => data
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, piece)| f(i, piece)),
        false => data
            .chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, piece)| f(i, piece)),
    }
}
