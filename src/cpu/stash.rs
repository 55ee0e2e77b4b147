//! The one side channel of the CPU ops: a value the forward pass leaves for a later pass.
//!
//! candle's custom ops (`CustomOp1/2/3`) return exactly one storage, and their backward pass
//! only sees the arguments, that result and its gradient. Some forward passes compute more
//! than the result that later passes need: the attention's row log-sum-exp (for the backward
//! and weights passes), the weights computed together with the output, the packed `q, k, v`
//! projection of the projected self-attention, the linear+GELU's pre-activation. Returning
//! them as extra columns of the result would make the caller narrow it (a non-contiguous
//! output, copied before the next product) and candle would pad each gradient with zeros into
//! a fresh full-size tensor: the very passes these ops exist to avoid. Recomputing them costs
//! a matrix product or a scores pass. So the op keeps them in a [`Stash`].

use std::sync::{Arc, Mutex, PoisonError};

/// A slot shared by the clones of one op call (the forward op and the weights op made from
/// it): the forward pass [`put`](Stash::put)s, later passes [`get`](Stash::get) or
/// [`take`](Stash::take). Each call makes a fresh one, so calls never see each other's values.
#[derive(Debug)]
pub(crate) struct Stash<T>(Arc<Mutex<Option<T>>>);

impl<T> Default for Stash<T> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }
}

impl<T> Clone for Stash<T> {
    /// The same slot (not a copy of the value).
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Stash<T> {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<T>> {
        // A panic elsewhere while holding the lock leaves the value valid: keep using it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `value`, replacing what was there.
    pub(crate) fn put(&self, value: T) {
        *self.slot() = Some(value);
    }

    /// Removes and returns the value, if any.
    pub(crate) fn take(&self) -> Option<T> {
        self.slot().take()
    }
}

impl<T: Clone> Stash<T> {
    /// A copy of the value, or an error naming `op` when the forward pass has not left one.
    pub(crate) fn get(&self, op: &str) -> candle::Result<T> {
        match &*self.slot() {
            Some(v) => Ok(v.clone()),
            None => candle::bail!("{op}: the forward pass has not run"),
        }
    }
}
