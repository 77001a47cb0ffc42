//! Drives one tab of a browser over CDP, through the agent's tunnel: attach, call,
//! navigate and evaluate. Managed auth adds its login-page scripts (`managed_auth::page`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use browser_agent_proto::v1::{CdpFrame, cdp_frame::Kind};
use futures::StreamExt;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::agent::AgentClient;

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A page target attached with a flat CDP session over the browser endpoint.
pub struct Page {
    to_browser: mpsc::Sender<CdpFrame>,
    pending: Pending,
    next_id: AtomicU64,
    session_id: String,
}

impl Page {
    /// Attaches to the browser's first page (opening one if it has none).
    pub async fn attach(agent: &AgentClient) -> anyhow::Result<Self> {
        let (to_browser, mut from_browser) = agent.open_cdp_tunnel("").await?;
        let pending: Pending = Arc::default();
        let replies = pending.clone();
        tokio::spawn(async move {
            while let Some(Ok(frame)) = from_browser.next().await {
                let Some(Kind::Text(text)) = frame.kind else {
                    continue;
                };
                let Ok(message) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                // Events carry no id; only replies are waited for.
                let Some(id) = message.get("id").and_then(Value::as_u64) else {
                    continue;
                };
                if let Some(waiter) = replies.lock().ok().and_then(|mut p| p.remove(&id)) {
                    let _ = waiter.send(message);
                }
            }
            // The tunnel closed: fail every waiting call.
            if let Ok(mut waiting) = replies.lock() {
                waiting.clear();
            }
        });
        let mut page =
            Self { to_browser, pending, next_id: AtomicU64::new(1), session_id: String::new() };
        let targets = page.call("Target.getTargets", json!({})).await?;
        let existing = targets["targetInfos"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["targetId"].as_str().map(str::to_owned));
        let target_id = match existing {
            Some(id) => id,
            None => {
                page.call("Target.createTarget", json!({"url": "about:blank"})).await?["targetId"]
                    .as_str()
                    .ok_or_else(|| anyhow!("Target.createTarget answered no targetId"))?
                    .to_owned()
            }
        };
        let attached = page
            .call("Target.attachToTarget", json!({"targetId": target_id, "flatten": true}))
            .await?;
        page.session_id = attached["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("Target.attachToTarget answered no sessionId"))?
            .to_owned();
        Ok(page)
    }

    /// Sends a command (to the attached page once attached) and waits for its result.
    pub async fn call(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({"id": id, "method": method, "params": params});
        if !self.session_id.is_empty() {
            message["sessionId"] = json!(self.session_id);
        }
        let (reply, answer) = oneshot::channel();
        self.pending.lock().map_err(|_| anyhow!("CDP reply table poisoned"))?.insert(id, reply);
        self.to_browser
            .send(CdpFrame { kind: Some(Kind::Text(message.to_string())) })
            .await
            .map_err(|_| anyhow!("the DevTools connection is closed"))?;
        let answer = tokio::time::timeout(CALL_TIMEOUT, answer)
            .await
            .with_context(|| format!("{method} did not answer within {CALL_TIMEOUT:?}"))?
            .map_err(|_| anyhow!("the DevTools connection closed during {method}"))?;
        if let Some(error) = answer.get("error") {
            bail!("{method} failed: {}", error["message"].as_str().unwrap_or("unknown error"));
        }
        Ok(answer["result"].clone())
    }

    pub async fn navigate(&self, url: &str) -> anyhow::Result<()> {
        let result = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(error) = result["errorText"].as_str().filter(|e| !e.is_empty()) {
            bail!("loading {url} failed: {error}");
        }
        Ok(())
    }

    /// Evaluates a JavaScript expression (awaiting a promise) and returns its value.
    pub async fn evaluate(&self, expression: &str) -> anyhow::Result<Value> {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await?;
        if let Some(exception) = result.get("exceptionDetails") {
            bail!(
                "the page's script failed: {}",
                exception["exception"]["description"]
                    .as_str()
                    .or(exception["text"].as_str())
                    .unwrap_or("exception")
            );
        }
        Ok(result["result"]["value"].clone())
    }
}
