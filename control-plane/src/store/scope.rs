//! The project a request is confined to, enforced by the store itself, the way a
//! database's row-level security confines a session: the HTTP layer runs every request
//! inside `request`, the `Org` extractor calls `confine` once it knows the caller's
//! project (its key's, or the one `X-Kernel-Project-Id` names), and from then on every
//! lookup and list of the organization's resources in that request sees that project's
//! rows only, and every row it inserts without a project of its own lands there. One
//! place, so that no handler can forget it.
//!
//! Outside a request (pool refills, reapers, start-up) nothing is confined: background
//! work acts for the whole organization, and a record it inserts names its project
//! itself (a pool's browsers are in the pool's project).
//!
//! Counts that enforce limits never depend on it: they name what they count.

use std::future::Future;
use std::sync::{Arc, OnceLock};

tokio::task_local! {
    static REQUEST_PROJECT: Arc<OnceLock<String>>;
}

/// Runs one request's handling; the store confines it once `confine` is called.
pub async fn request<F: Future>(handling: F) -> F::Output {
    REQUEST_PROJECT.scope(Arc::default(), handling).await
}

/// Confines the rest of the current request to `project_id`. Outside a request, or a
/// second time, it changes nothing.
pub fn confine(project_id: &str) {
    let _ = REQUEST_PROJECT.try_with(|cell| cell.set(project_id.to_owned()));
}

/// The project the current request is confined to, if any.
pub fn current() -> Option<String> {
    REQUEST_PROJECT.try_with(|cell| cell.get().cloned()).ok().flatten()
}

/// The project a row the current request makes belongs to: the request's, else the
/// organization's default project.
pub async fn project_for_new(
    store: &(impl super::AccessStore + ?Sized), org_id: &str,
) -> super::StoreResult<String> {
    match current() {
        Some(project_id) => Ok(project_id),
        None => store.default_project_id(org_id).await,
    }
}

/// Runs `work` for the whole organization even inside a confined request: counts that
/// enforce an organization's limits must see all of its projects.
pub async fn organization_wide<F: Future>(work: F) -> F::Output {
    REQUEST_PROJECT.scope(Arc::default(), work).await
}

/// Whether a row of `project_id` is visible to the current request.
pub fn admits(project_id: Option<&str>) -> bool {
    match current() {
        Some(confined) => project_id == Some(confined.as_str()),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_is_confined_once_and_only_inside() {
        assert_eq!(current(), None);
        confine("proj_a");
        assert_eq!(current(), None, "outside a request nothing is confined");
        request(async {
            assert!(admits(Some("proj_b")));
            confine("proj_a");
            confine("proj_b");
            assert_eq!(current().as_deref(), Some("proj_a"));
            assert!(admits(Some("proj_a")));
            assert!(!admits(Some("proj_b")));
            assert!(!admits(None));
            // Work spawned off the request acts for the whole organization.
            let spawned = tokio::spawn(async { current() }).await.unwrap();
            assert_eq!(spawned, None);
        })
        .await;
    }
}
