//! The browser a flow or health check drives: started with the connection's profile (or
//! re-attached after a restart), and ended when the workflow is done with it. Login flows
//! run headful, so that a person can step in through their `live_view_url`; health
//! checks, which nobody watches, headless.

use super::{PAGE_SETTLE_TIMEOUT, Workflow};
use crate::managed_auth::FLOW_TTL;
use crate::managed_auth::page::{Assessment, Page};
use crate::sessions::{BrowserConfig, CdpConnectionGuard, ProfileReference};
use crate::store::SessionRecord;

/// The browser of a flow or health check, driven over CDP.
pub(super) struct FlowBrowser {
    pub(super) session: SessionRecord,
    pub(super) page: Page,
    /// Counts as an open CDP connection, so the inactivity timeout spares the browser.
    _in_use: CdpConnectionGuard,
}

impl Workflow {
    pub(super) async fn load(&self, url: &str) -> anyhow::Result<Assessment> {
        let browser = self.browser.as_ref().ok_or_else(|| anyhow::anyhow!("no browser"))?;
        browser.page.navigate(url).await?;
        browser.page.settled(PAGE_SETTLE_TIMEOUT).await
    }

    /// A browser with the connection's profile (never saving by itself), or the flow's
    /// browser that survived a restart.
    pub(super) async fn open_browser(
        &mut self, reuse: Option<&str>, headful: bool,
    ) -> anyhow::Result<()> {
        if self.browser.is_some() {
            return Ok(());
        }
        let org_id = self.record.org_id.clone();
        let reused = match reuse {
            Some(session_id) => self.sessions.live(&org_id, session_id).await.ok(),
            None => None,
        };
        let session = match reused {
            Some(session) => session,
            None => {
                let config = BrowserConfig {
                    headless: Some(!headful),
                    timeout_seconds: Some(FLOW_TTL.num_seconds() + 60),
                    proxy_id: self.document.proxy_id.clone(),
                    stealth: Some(self.document.stealth),
                    profile: Some(ProfileReference {
                        id: Some(self.document.profile_id.clone()),
                        name: None,
                        save_changes: Some(false),
                    }),
                    telemetry: self.document.browser_telemetry.clone(),
                    ..Default::default()
                };
                let spec = self.sessions.spec(&org_id, &config, None, Vec::new()).await?;
                self.sessions.create(&org_id, spec).await?
            }
        };
        let in_use = self.sessions.cdp_connection_opened(&session.id);
        let agent = self.sessions.agent(&session)?;
        let page = match Page::attach(&agent).await {
            Ok(page) => page,
            Err(error) => {
                let _ = self.sessions.end(&session, "managed auth could not drive it").await;
                return Err(error);
            }
        };
        self.browser = Some(FlowBrowser { session, page, _in_use: in_use });
        Ok(())
    }

    pub(super) async fn end_browser(&self, browser: FlowBrowser) {
        let FlowBrowser { session, .. } = browser;
        if let Err(error) = self.sessions.end(&session, "managed auth is done with it").await {
            tracing::warn!(%error, "ending a managed-auth browser failed");
        }
    }

    /// Ends the flow's browser: the one this workflow drives, or the session the flow
    /// recorded (after a restart, before it was re-attached).
    pub(super) async fn end_flow_browser(&mut self) {
        if let Some(browser) = self.browser.take() {
            self.end_browser(browser).await;
        } else if let Some(session_id) = self.flow_mut().and_then(|flow| flow.session_id.clone()) {
            self.end_session(&session_id).await;
        }
    }

    async fn end_session(&self, session_id: &str) {
        if let Ok(session) = self.sessions.live(&self.record.org_id, session_id).await {
            let _ = self.sessions.end(&session, "managed auth is done with it").await;
        }
    }
}
