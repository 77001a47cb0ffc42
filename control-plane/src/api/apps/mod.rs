//! Apps as code: deployments, invocations and their event streams.

pub mod deployments;
pub mod events;
pub mod invocations;
