//! Large scratch buffers of the CPU ops, kept between calls.
//!
//! A fresh multi-megabyte `Vec` per call costs page faults whenever glibc has handed the
//! previous one back to the operating system (its defaults do, for large blocks and for free
//! memory at the top of the heap): every page is faulted in and zeroed again. The ops take
//! their large buffers that do not escape to candle (the packed `q|k|v` projection kept for
//! the backward pass, its gradient, the packed heads) from a pool instead, and give them back
//! when done. A buffer comes back with whatever the last user left in it: every user writes
//! each element it reads.
//!
//! One pool per dtype for the whole process (not per thread): a buffer may be returned on
//! another thread than the one that took it (an autograd graph dropped elsewhere), two calls
//! running at once simply hold two buffers, and rayon's work stealing cannot alias one.
//! Memory cost: a new buffer is made only when no kept one is large enough, so the pool holds
//! about as many buffers as were in use at once (a model's training step holds two per block
//! from its forward pass to its backward pass: the projection and the linear+GELU's
//! pre-activation), of the largest sizes used, and never more than [`KEPT`] per dtype;
//! [`crate::runtime::release_workspace`] frees them.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Elem;

/// Buffers kept per dtype at most: room for a 15-block model's step (two held per block,
/// one gradient in flight) without a fresh buffer per step.
pub(crate) const KEPT: usize = 32;

/// Bytes a buffer's start is aligned to: a cache line.
const ALIGN: usize = 64;

/// The free buffers of one dtype.
pub(crate) struct Pool<T>(Mutex<Vec<Vec<T>>>);

impl<T> Pool<T> {
    pub(crate) const fn new() -> Self {
        Self(Mutex::new(Vec::new()))
    }

    fn free(&self) -> MutexGuard<'_, Vec<Vec<T>>> {
        // The list stays valid whatever a panicking holder did: keep using it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops every kept buffer; returns the bytes freed.
    pub(crate) fn release(&self) -> usize {
        let bufs = std::mem::take(&mut *self.free());
        bufs.iter().map(|b| b.capacity()).sum::<usize>() * std::mem::size_of::<T>()
    }

    /// Bytes held by the kept buffers.
    pub(crate) fn bytes(&self) -> usize {
        self.free().iter().map(|b| b.capacity()).sum::<usize>() * std::mem::size_of::<T>()
    }
}

/// A pooled buffer of `len` elements with unspecified contents; back to the pool on drop.
pub(crate) struct Buf<T: Elem> {
    /// Initialised as far as any user of the buffer ever needed (never truncated, so a
    /// buffer that goes from a short use to a longer one is not filled again).
    data: Vec<T>,
    /// Where the buffer starts in `data`: the first element on a 64-byte boundary.
    off: usize,
    len: usize,
    /// Where it goes back.
    pool: &'static Pool<T>,
}

/// A buffer of `len` elements from the pool of `T` (the smallest kept one that is large
/// enough), or a new one. Its contents are whatever was there: the caller writes before it
/// reads.
pub(crate) fn take<T: Elem>(len: usize) -> Buf<T> {
    T::pool().take(len)
}

impl<T: Elem> Pool<T> {
    /// [`take`] from this pool.
    fn take(&'static self, len: usize) -> Buf<T> {
        // Room to start on a cache line: glibc's large blocks start 16 bytes past one, so a
        // packed panel's 64-byte rows would each straddle two lines (one of every two vector
        // loads of the register tiles split). The gain on the linear products is small but
        // not negative (`docs/benchmarks.md`).
        let pad = ALIGN / std::mem::size_of::<T>();
        let len_in = len;
        let len = len + pad;
        let found = {
            let mut free = self.free();
            let fit = free
                .iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i);
            match fit {
                Some(i) => Some(free.swap_remove(i)),
                None => {
                    // None is large enough: drop the largest (outgrown) one rather than keep
                    // buffers the calls have outgrown.
                    let largest = (0..free.len()).max_by_key(|&i| free[i].capacity());
                    largest.map(|i| free.swap_remove(i));
                    None
                }
            }
        };
        let data = match found {
            // Keep the initialised part as it is (no pass over memory that will be
            // overwritten); only a tail never used before is filled.
            Some(mut data) => {
                if data.len() < len {
                    data.resize(len, T::ZERO);
                }
                data
            }
            // Zeroed by the allocator (fresh pages need no pass).
            None => vec![T::ZERO; len],
        };
        let off = data.as_ptr().align_offset(ALIGN).min(pad);
        Buf {
            data,
            off,
            len: len_in,
            pool: self,
        }
    }
}

impl<T: Elem> Drop for Buf<T> {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        if data.capacity() == 0 {
            return;
        }
        let mut free = self.pool.free();
        free.push(data);
        if free.len() > KEPT {
            let smallest = (0..free.len()).min_by_key(|&i| free[i].capacity());
            if let Some(i) = smallest {
                free.swap_remove(i);
            }
        }
    }
}

impl<T: Elem> Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data[self.off..self.off + self.len]
    }
}

impl<T: Elem> DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data[self.off..self.off + self.len]
    }
}

impl<T: Elem> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({} x {:?})", self.len, T::DTYPE)
    }
}

/// A pooled buffer of either CPU dtype, for the side channels that hold one across passes.
#[derive(Debug)]
pub(crate) enum AnyBuf {
    F32(Buf<f32>),
    F64(Buf<f64>),
}

impl From<Buf<f32>> for AnyBuf {
    fn from(b: Buf<f32>) -> Self {
        AnyBuf::F32(b)
    }
}

impl From<Buf<f64>> for AnyBuf {
    fn from(b: Buf<f64>) -> Self {
        AnyBuf::F64(b)
    }
}

/// Drops every kept buffer of both dtypes; returns the bytes freed.
pub(crate) fn release() -> usize {
    <f32 as Elem>::pool().release() + <f64 as Elem>::pool().release()
}

/// Bytes held by the kept buffers of both dtypes.
pub(crate) fn bytes() -> usize {
    <f32 as Elem>::pool().bytes() + <f64 as Elem>::pool().bytes()
}

#[cfg(test)]
mod tests {
    use super::Pool;

    /// A buffer taken short and then long again keeps what its longer use wrote (no second
    /// fill of memory every user overwrites anyway); a new buffer starts zeroed.
    #[test]
    fn a_kept_buffer_is_not_filled_again() {
        let pool: &'static Pool<f32> = Box::leak(Box::new(Pool::new()));
        {
            let mut b = pool.take(10);
            assert!(b.iter().all(|&x| x == 0.0));
            b.fill(7.0);
        }
        {
            let b = pool.take(4);
            assert_eq!(b.len(), 4);
        }
        let b = pool.take(10);
        assert_eq!(&b[..], [7.0; 10], "the kept buffer was filled again");
        drop(b);
        assert_eq!(pool.bytes(), (10 + 16) * 4);
    }

    /// Every buffer starts on a 64-byte line, new or kept, in both dtypes.
    #[test]
    fn buffers_start_on_a_cache_line() {
        let f: &'static Pool<f32> = Box::leak(Box::new(Pool::new()));
        let d: &'static Pool<f64> = Box::leak(Box::new(Pool::new()));
        for len in [1, 3, 17, 1000, 1 << 18, 5, 1 << 18] {
            let (a, b) = (f.take(len), d.take(len));
            assert_eq!((a.len(), b.len()), (len, len));
            assert_eq!(a.as_ptr() as usize % 64, 0, "f32 buffer of {len}");
            assert_eq!(b.as_ptr() as usize % 64, 0, "f64 buffer of {len}");
        }
    }
}
