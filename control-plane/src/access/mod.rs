//! Who may call the API, and what they may do: API keys (`keys`), their policies
//! (`policy`) and the action each route needs (`actions`). The HTTP layer's `Org`
//! extractor (`crate::api::org`) puts them together for every request.

pub mod actions;
pub mod keys;
pub mod policy;
