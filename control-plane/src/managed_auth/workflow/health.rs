//! The periodic health check: is the profile still logged in, and if not, a REAUTH flow
//! when values are saved or the connection has a credential.

use chrono::Utc;

use super::Workflow;
use crate::managed_auth::{AuthStatus, FlowType};

impl Workflow {
    /// Opens the health check's browser at the last post-login page and decides.
    pub(super) async fn health_check(&mut self) {
        let interval = chrono::Duration::seconds(self.document.health_check_interval);
        self.document.next_health_check_at = Utc::now() + interval;
        let result = async {
            self.open_browser(None, false).await?;
            let target =
                self.document.post_login_url.clone().unwrap_or_else(|| self.login_target());
            self.load(&target).await
        }
        .await;
        let session_id = self.browser.as_ref().map(|browser| browser.session.id.clone());
        if let Some(browser) = self.browser.take() {
            self.end_browser(browser).await;
        }
        let assessment = match result {
            Ok(assessment) => assessment,
            Err(error) => {
                tracing::warn!(connection_id = %self.id(), error = format!("{error:#}"), "health check could not run");
                self.save_quietly().await;
                return;
            }
        };
        let logged_in = !assessment.password_field && self.inside(&assessment.url);
        let before = self.document.status;
        self.document.status =
            if logged_in { AuthStatus::Authenticated } else { AuthStatus::NeedsAuth };
        self.document.record_health_check(before, self.document.status, session_id);
        tracing::info!(connection_id = %self.id(), logged_in, "health check");
        self.save_quietly().await;
        let can_reauth = self.record.credentials.is_some() || self.document.credential.is_some();
        if !logged_in && self.document.auto_reauth && can_reauth {
            self.begin_flow(FlowType::Reauth).await;
            Box::pin(self.discover()).await;
        }
    }
}
