//! The login-page scripts of managed auth (form discovery, filling and submitting,
//! assessment), run in a tab driven over CDP (`agent::page`).

use std::time::Duration;

use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

pub use crate::agent::page::Page;

/// The login-page scripts.
impl Page {
    /// What the page shows now (`None` while it is loading or between documents).
    pub async fn assess(&self) -> Option<Assessment> {
        let value = self.evaluate(ASSESS_SCRIPT).await.ok()?;
        serde_json::from_value(value).ok()
    }

    /// Waits until the page has loaded and shown the same thing for a moment.
    pub async fn settled(&self, within: Duration) -> anyhow::Result<Assessment> {
        let deadline = tokio::time::Instant::now() + within;
        let mut previous: Option<Assessment> = None;
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = self.assess().await;
            match (&previous, now) {
                (Some(before), Some(now)) if *before == now => return Ok(now),
                (_, now) => previous = now,
            }
            if tokio::time::Instant::now() >= deadline {
                return previous.ok_or_else(|| anyhow!("the page did not finish loading"));
            }
        }
    }

    /// Waits until the page holds a document loaded after `fill_and_submit` marked the
    /// old one, or `within` passes (a page that answers a submission without navigating).
    pub async fn wait_for_new_document(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // Between documents the evaluation fails; a new one has no marker.
            let marked = self.evaluate("window.__managedAuthSubmitted === true").await;
            if let Ok(Value::Bool(false)) = marked {
                return;
            }
        }
    }

    /// Fills the discovered fields and submits their form.
    pub async fn fill_and_submit(
        &self, values: &[(DiscoveredField, String)],
    ) -> anyhow::Result<()> {
        let fields: Vec<Value> = values
            .iter()
            .map(|(field, value)| json!({"selector": field.selector, "value": value}))
            .collect();
        let script = format!("({FILL_AND_SUBMIT_SCRIPT})({})", Value::Array(fields));
        let outcome = self.evaluate(&script).await;
        match outcome {
            Ok(Value::String(problem)) => bail!("{problem}"),
            Ok(_) => Ok(()),
            // Submitting navigates: the evaluation may lose its document before answering.
            Err(error) if error.to_string().contains("context") => Ok(()),
            Err(error) => Err(error),
        }
    }

    /// Follows the page's link to a login page, if it has one; returns whether it did.
    pub async fn follow_login_link(&self) -> anyhow::Result<bool> {
        let href = self.evaluate(LOGIN_LINK_SCRIPT).await?;
        match href.as_str() {
            Some(href) if !href.is_empty() => {
                self.navigate(href).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl Page {
    /// Follows the page's sign-in button or link of an SSO provider (its name in the
    /// button's text or label, e.g. "Sign in with Google"); returns whether there was one.
    pub async fn follow_sso_button(&self, provider: &str) -> anyhow::Result<bool> {
        let script = format!("({SSO_BUTTON_SCRIPT})({})", Value::String(provider.to_owned()));
        match self.evaluate(&script).await {
            Ok(Value::String(href)) if !href.is_empty() => {
                self.navigate(&href).await?;
                Ok(true)
            }
            Ok(Value::Bool(clicked)) => Ok(clicked),
            Ok(_) => Ok(false),
            // A click that navigates may lose the document before the answer.
            Err(error) if error.to_string().contains("context") => Ok(true),
            Err(error) => Err(error),
        }
    }
}

/// A form field the user (or the saved credentials) must fill, as the SDKs read it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct DiscoveredField {
    pub name: String,
    pub label: String,
    /// text, email, password, tel, number, url, code or totp.
    #[serde(rename = "type")]
    pub kind: String,
    pub selector: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    #[serde(default)]
    pub required: bool,
}

impl DiscoveredField {
    /// One-time codes are never stored.
    pub fn is_one_time(&self) -> bool {
        matches!(self.kind.as_str(), "code" | "totp")
    }
}

/// What a page shows, as far as logging in is concerned.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Assessment {
    pub url: String,
    /// Visible fields of the page's login form (empty when it has none).
    pub fields: Vec<DiscoveredField>,
    /// A visible password field is on the page.
    pub password_field: bool,
    /// A visible error message (role=alert, aria-invalid hints, "error" classes).
    pub error: Option<String>,
}

/// Collects the visible fields of the login form (the form with a password field, else
/// the first with a text-like field), their labels and unique selectors, plus a visible
/// error message. Returns null until the document has loaded.
const ASSESS_SCRIPT: &str = r#"(() => {
  if (document.readyState !== 'complete') return null;
  const visible = (el) => {
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    return style.display !== 'none' && style.visibility !== 'hidden' && box.width > 0 && box.height > 0;
  };
  const fillable = (el) => el.matches('input, textarea') && visible(el) && !el.disabled &&
    !['hidden', 'submit', 'button', 'checkbox', 'radio', 'image', 'reset', 'file'].includes((el.type || '').toLowerCase());
  const inputs = [...document.querySelectorAll('input, textarea')].filter(fillable);
  const password = inputs.find((el) => el.type === 'password');
  const form = password ? password.form : (inputs[0] && inputs[0].form);
  const scope = inputs.filter((el) => form ? el.form === form : true);
  const cssEscape = (s) => (window.CSS && CSS.escape) ? CSS.escape(s) : s.replace(/[^a-zA-Z0-9_-]/g, '\\$&');
  const selectorOf = (el) => {
    if (el.id && document.querySelectorAll('#' + cssEscape(el.id)).length === 1) return '#' + cssEscape(el.id);
    if (el.name) {
      const byName = `${el.tagName.toLowerCase()}[name="${el.name.replace(/"/g, '\\"')}"]`;
      if (document.querySelectorAll(byName).length === 1) return byName;
    }
    const path = [];
    for (let node = el; node && node.nodeType === 1 && node !== document.documentElement; node = node.parentElement) {
      const siblings = [...node.parentElement.children].filter((s) => s.tagName === node.tagName);
      path.unshift(`${node.tagName.toLowerCase()}:nth-of-type(${siblings.indexOf(node) + 1})`);
    }
    return 'html > ' + path.join(' > ');
  };
  const labelOf = (el) => {
    const text = (s) => (s || '').replace(/\s+/g, ' ').trim();
    if (el.labels && el.labels.length) return text(el.labels[0].innerText);
    if (el.getAttribute('aria-label')) return text(el.getAttribute('aria-label'));
    const by = el.getAttribute('aria-labelledby');
    if (by && document.getElementById(by)) return text(document.getElementById(by).innerText);
    return text(el.placeholder || el.name || el.id || el.type);
  };
  const kindOf = (el) => {
    const type = (el.type || 'text').toLowerCase();
    const hint = `${el.name} ${el.id} ${el.autocomplete} ${el.placeholder}`.toLowerCase();
    if (type === 'password') return 'password';
    if (el.autocomplete === 'one-time-code' || /\b(otp|totp|mfa|2fa|one.?time|verification.?code|code)\b/.test(hint)) return 'code';
    if (['email', 'tel', 'number', 'url'].includes(type)) return type;
    return 'text';
  };
  const fields = scope.map((el, index) => ({
    name: el.name || el.id || `${kindOf(el)}_${index}`,
    label: labelOf(el),
    type: kindOf(el),
    selector: selectorOf(el),
    placeholder: el.placeholder || null,
    required: !!el.required,
  }));
  const errors = [...document.querySelectorAll('[role=alert], [aria-live=assertive], .error, .errors, .alert-danger, .alert-error, .error-message, .form-error, [class*="error" i], [id*="error" i]')]
    .filter((el) => visible(el) && el.innerText && el.innerText.trim())
    .map((el) => el.innerText.replace(/\s+/g, ' ').trim());
  return { url: location.href, fields, password_field: !!password, error: errors.length ? errors[0].slice(0, 500) : null };
})()"#;

/// Sets each field's value as typing would (the native setter, then input and change
/// events, so frameworks notice), then submits the form of the last field: its submit
/// button if it has one (a click runs the site's handlers), else `requestSubmit`.
const FILL_AND_SUBMIT_SCRIPT: &str = r#"(fields) => {
  window.__managedAuthSubmitted = true;
  let last = null;
  for (const { selector, value } of fields) {
    const el = document.querySelector(selector);
    if (!el) return `the field ${selector} is no longer on the page`;
    const setter = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(el), 'value').set;
    el.focus();
    setter.call(el, value);
    el.dispatchEvent(new Event('input', { bubbles: true }));
    el.dispatchEvent(new Event('change', { bubbles: true }));
    last = el;
  }
  if (!last) return 'nothing to fill';
  const form = last.form;
  const button = form
    ? form.querySelector('button[type=submit], input[type=submit], button:not([type])')
    : document.querySelector('button[type=submit], input[type=submit]');
  setTimeout(() => {
    if (button) button.click();
    else if (form) form.requestSubmit();
  }, 0);
  return null;
}"#;

/// The href of a visible link naming the provider, or `true` after clicking such a
/// button (`false` when there is none).
const SSO_BUTTON_SCRIPT: &str = r#"(provider) => {
  const wanted = provider.toLowerCase();
  const named = (el) => [el.innerText, el.getAttribute('aria-label'), el.getAttribute('title'), el.value]
    .some((text) => (text || '').toLowerCase().includes(wanted));
  const visible = (el) => { const box = el.getBoundingClientRect(); return box.width > 0 && box.height > 0; };
  const found = [...document.querySelectorAll('a[href], button, [role=button], input[type=submit], input[type=button]')]
    .find((el) => visible(el) && named(el));
  if (!found) return false;
  if (found.matches('a[href]')) return found.href;
  window.__managedAuthSubmitted = true;
  setTimeout(() => found.click(), 0);
  return true;
}"#;

/// The href of a visible link or button that leads to a login page.
const LOGIN_LINK_SCRIPT: &str = r#"(() => {
  const pattern = /\b(log ?in|sign ?in|signin|login)\b/i;
  const link = [...document.querySelectorAll('a[href]')]
    .find((a) => pattern.test(a.innerText || '') || pattern.test(a.getAttribute('href') || ''));
  return link ? link.href : null;
})()"#;
