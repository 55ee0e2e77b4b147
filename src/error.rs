//! Typed errors carried through [`candle::Error`]: [`typed`] wraps one, [`find`] finds it
//! again and [`take`] takes it back out, so that a caller can branch on a variant while every
//! function keeps returning `candle::Result`.
//!
//! candle's `Error` has no variant that keeps both the message and the type of an error it
//! did not define (`Error::Wrapped` keeps only a `Display`); [`std::io::Error::other`] keeps
//! both, so a typed error travels as `candle::Error::Io` holding it. Its message is the typed
//! error's own.
//!
//! ```
//! use candle_mha::checkpoint::{CheckpointError, StateDict};
//! let err = StateDict::load("no/such/model.safetensors").unwrap_err();
//! match candle_mha::error::find::<CheckpointError>(&err) {
//!     Some(CheckpointError::Unreadable { path, .. }) => assert!(path.ends_with("model.safetensors")),
//!     other => panic!("{other:?}"),
//! }
//! ```
//!
//! PyTorch equivalent: Python's exception classes (`except FileNotFoundError`).

/// `e` as a `candle::Error` whose message is `e`'s and from which [`find`] and [`take`] get
/// `e` back.
pub fn typed<E: std::error::Error + Send + Sync + 'static>(e: E) -> candle::Error {
    candle::Error::Io(std::io::Error::other(e))
}

/// The error of type `E` that `e` carries ([`typed`]), looking through candle's backtrace,
/// context and path wrappers; `None` when it carries none.
pub fn find<E: std::error::Error + 'static>(e: &candle::Error) -> Option<&E> {
    match e {
        candle::Error::Io(io) => io.get_ref().and_then(|inner| inner.downcast_ref::<E>()),
        candle::Error::WithBacktrace { inner, .. }
        | candle::Error::Context { inner, .. }
        | candle::Error::WithPath { inner, .. } => find(inner),
        candle::Error::WrappedContext { wrapped, .. } => wrapped.downcast_ref::<E>(),
        _ => None,
    }
}

/// The error of type `E` that `e` carries, taken out of it (a backtrace is dropped); `e`
/// itself when it carries another (or sits under a context or a path, which would be lost).
pub fn take<E: std::error::Error + 'static>(e: candle::Error) -> Result<E, candle::Error> {
    match e {
        candle::Error::Io(io) if io.get_ref().is_some_and(|i| i.is::<E>()) => {
            let inner = io.into_inner().expect("checked above");
            Ok(*inner.downcast::<E>().expect("checked above"))
        }
        candle::Error::WithBacktrace { inner, backtrace } => match take(*inner) {
            Ok(typed) => Ok(typed),
            Err(inner) => Err(candle::Error::WithBacktrace {
                inner: Box::new(inner),
                backtrace,
            }),
        },
        e => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Mine(u32);

    impl std::fmt::Display for Mine {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "mine {}", self.0)
        }
    }

    impl std::error::Error for Mine {}

    #[test]
    fn a_typed_error_keeps_its_message_and_comes_back() {
        let e = typed(Mine(3));
        assert_eq!(e.to_string(), "mine 3");
        assert_eq!(find::<Mine>(&e), Some(&Mine(3)));
        // Through candle's wrappers too.
        let wrapped = typed(Mine(4)).bt().context("while loading");
        assert_eq!(find::<Mine>(&wrapped), Some(&Mine(4)));
        assert_eq!(take::<Mine>(typed(Mine(5)).bt()).ok(), Some(Mine(5)));
        // Another error is not it, and is handed back whole.
        let other = candle::Error::Msg("disk full".into());
        assert!(find::<Mine>(&other).is_none());
        assert_eq!(take::<Mine>(other).unwrap_err().to_string(), "disk full");
        let io = candle::Error::Io(std::io::Error::other("plain"));
        assert!(find::<Mine>(&io).is_none());
    }
}
