//! Types with no I/O shared by every ctrlplane crate.
//!
//! Everything here is pure: no network, no database, no clock beyond the one
//! inside UUIDv7 generation. Services build on it for
//!
//! - [`id`]: TypeIDs (`dc_…`, `bws_…`, `agt_…`, `jtk_…`, `evt_…`),
//! - [`violations`]: collecting field violations and turning them into an
//!   `INVALID_ARGUMENT` status with `google.rpc.BadRequest` details,
//! - [`validate`]: the validation rules for labels, metadata, service specs
//!   and bootstrap service specs,
//! - [`page`]: opaque page tokens and page-size handling,
//! - [`selector`]: `k=v,k2=v2` label selectors,
//! - [`slug`]: URL-friendly slugs derived from names.
//!
//! Validation never stops at the first problem: every rule records a
//! [`FieldViolation`] and carries on, so a caller sees every bad field at once.

#![forbid(unsafe_code)]

pub mod id;
pub mod page;
pub mod selector;
pub mod slug;
pub mod snapshot;
pub mod validate;
pub mod violations;

pub use violations::{FieldViolation, Violations};
