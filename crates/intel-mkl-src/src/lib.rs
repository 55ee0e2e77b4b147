//! Links Intel MKL (static, LP64, Intel OpenMP threading) from `$MKLROOT`; no code.
#![no_std]
