//! Loom models of pinpool's buffer handoff protocol live in `tests/`; they
//! run only with `RUSTFLAGS="--cfg loom"` (see the README).
