//! The organization: API keys, projects, limits, the audit log and its export, and telemetry
//! destinations.

pub mod api_keys;
pub mod audit_export;
pub mod audit_logs;
pub mod limits;
pub mod projects;
pub mod telemetry_destinations;
