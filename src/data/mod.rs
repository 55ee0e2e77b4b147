//! Data.
