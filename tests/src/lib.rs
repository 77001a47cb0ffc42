//! See `tests/*.rs` and `tests/e2e/`.
