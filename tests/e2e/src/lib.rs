//! End-to-end resilience tests of the control plane (see `tests/`): the
//! real binaries (`cargo build --workspace`) run as child processes, so a
//! `kill -9` is a real one. This library is empty.

#![forbid(unsafe_code)]
