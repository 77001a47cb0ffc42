//! What browsers are made with: pools of warm browsers, profiles, extensions (also from the
//! Chrome Web Store) and proxies.

pub mod chrome_store;
pub mod extensions;
pub mod pools;
pub mod profiles;
pub mod proxies;
