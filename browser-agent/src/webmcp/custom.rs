//! Custom WebMCP tools: tools the caller defines for a browser, listed on every tab whose
//! page or one of its frames matches their URL patterns, and run in that tab's top-level
//! page. A batch's source is JavaScript evaluated (in a blank background tab of the
//! browser, closed after) to an array of `{ kind?: "page", match: { url_patterns },
//! tool: { name, description, inputSchema, outputSchema?, annotations? }, execute }`;
//! each `execute` is kept as its source text and called with the input in the page.
//! The definitions live in the agent for the browser's life, across navigations and
//! Chromium restarts.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tonic::Status;

use crate::cdp_client::CdpClient;

/// Largest source a batch may have.
pub const MAX_SOURCE_BYTES: usize = 8_000_000;
/// Largest output a custom tool may answer, as JSON.
pub const MAX_OUTPUT_BYTES: usize = 240 * 1024;
/// Most custom tools a browser holds.
const MAX_TOOLS: usize = 256;

/// One custom tool.
#[derive(Clone, Debug)]
pub struct Definition {
    pub id: String,
    pub namespace: String,
    pub kind: String,
    pub url_patterns: Vec<String>,
    /// MCP's shape: name, description, inputSchema and what else was given.
    pub tool: Value,
    /// The source text of its `execute` function.
    pub execute: String,
}

#[derive(Default)]
pub struct CustomTools {
    definitions: Mutex<Vec<Definition>>,
}

/// Turns the source into plain data the agent can keep: each definition's fields, with
/// `execute` as its source text. Runs in the page, so nothing of the caller's code runs
/// in the agent.
const DESCRIBE: &str = r#"(definitions) => {
  if (!Array.isArray(definitions) || definitions.length === 0)
    throw new Error("the source must evaluate to a non-empty array of tool definitions");
  return definitions.map((definition, index) => {
    if (!definition || typeof definition !== "object") throw new Error(`definition ${index} is not an object`);
    if (typeof definition.execute !== "function") throw new Error(`definition ${index} has no execute function`);
    return { kind: definition.kind ?? "page", match: definition.match ?? null,
             tool: definition.tool ?? null, execute: String(definition.execute) };
  });
}"#;

/// Resolves a kept `execute` text to the function again: an expression (`async (input)
/// => …`, `function …`) or a method (`async execute(input) { … }`).
const RESOLVE: &str = r#"(text) => { try { return (0, eval)("(" + text + ")"); } catch (_) { return Object.values((0, eval)("({" + text + "})"))[0]; } }"#;

impl CustomTools {
    pub fn all(&self) -> Vec<Definition> {
        self.definitions.lock().map(|definitions| definitions.clone()).unwrap_or_default()
    }

    pub fn get(&self, id: &str) -> Option<Definition> {
        self.all().into_iter().find(|definition| definition.id == id)
    }

    pub fn remove(&self, id: &str) -> Result<(), Status> {
        let mut definitions =
            self.definitions.lock().map_err(|_| Status::internal("custom tools unavailable"))?;
        let before = definitions.len();
        definitions.retain(|definition| definition.id != id);
        if definitions.len() == before {
            return Err(Status::not_found(format!("custom tool {id} not found")));
        }
        Ok(())
    }

    /// Evaluates a batch's source in the browser and adds its tools at once (replacing
    /// the namespace's with `overwrite`).
    pub async fn add(
        &self, browser_ws_url: &str, namespace: &str, source: &str, overwrite: bool,
    ) -> Result<Vec<Definition>, Status> {
        let described = describe(browser_ws_url, source).await?;
        let mut batch = Vec::new();
        for (index, described) in described.iter().enumerate() {
            batch.push(checked(index, namespace, described)?);
        }
        let mut definitions =
            self.definitions.lock().map_err(|_| Status::internal("custom tools unavailable"))?;
        let kept: Vec<&Definition> = definitions
            .iter()
            .filter(|definition| !(overwrite && definition.namespace == namespace))
            .collect();
        let mut names: Vec<&str> = kept
            .iter()
            .filter(|definition| definition.namespace == namespace)
            .map(|definition| definition.tool["name"].as_str().unwrap_or_default())
            .collect();
        for definition in &batch {
            let name = definition.tool["name"].as_str().unwrap_or_default();
            if names.contains(&name) {
                return Err(Status::already_exists(format!(
                    "namespace {namespace} already has a tool named {name:?} (force_overwrite_namespace replaces the namespace)"
                )));
            }
            names.push(name);
        }
        if kept.len() + batch.len() > MAX_TOOLS {
            return Err(Status::resource_exhausted(format!(
                "a browser holds at most {MAX_TOOLS} custom tools"
            )));
        }
        if overwrite {
            definitions.retain(|definition| definition.namespace != namespace);
        }
        definitions.extend(batch.iter().cloned());
        Ok(batch)
    }
}

/// An id unique in this agent: the time and a count.
pub fn new_id(prefix: &str) -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|since| since.as_nanos())
        .unwrap_or_default();
    let count = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}_{nanos:x}{count:04x}")
}

fn checked(index: usize, namespace: &str, described: &Value) -> Result<Definition, Status> {
    let invalid = |why: &str| Status::invalid_argument(format!("definition {index}: {why}"));
    let kind = described["kind"].as_str().unwrap_or_default();
    if kind != "page" {
        return Err(invalid(
            "kind must be \"page\" (its execute runs in the page); CDP-backed tools are not supported by this server",
        ));
    }
    let url_patterns: Vec<String> = described["match"]["url_patterns"]
        .as_array()
        .map(|patterns| {
            patterns.iter().filter_map(|pattern| pattern.as_str().map(str::to_owned)).collect()
        })
        .unwrap_or_default();
    if url_patterns.is_empty()
        || described["match"]["url_patterns"].as_array().map(Vec::len) != Some(url_patterns.len())
    {
        return Err(invalid("match.url_patterns must be a non-empty array of strings"));
    }
    let tool = &described["tool"];
    let name = tool["name"].as_str().unwrap_or_default();
    if name.is_empty() || name.len() > 128 {
        return Err(invalid("tool.name must be 1 to 128 characters"));
    }
    if !tool["description"].is_string() {
        return Err(invalid("tool.description must be a string"));
    }
    let mut tool = tool.clone();
    if !tool["inputSchema"].is_object() {
        tool["inputSchema"] = json!({ "type": "object" });
    }
    Ok(Definition {
        id: new_id("ct"),
        namespace: namespace.to_owned(),
        kind: kind.to_owned(),
        url_patterns,
        tool,
        execute: described["execute"].as_str().unwrap_or_default().to_owned(),
    })
}

/// Evaluates the source in a blank background tab and answers the definitions as data.
async fn describe(browser_ws_url: &str, source: &str) -> Result<Vec<Value>, Status> {
    let mut client = CdpClient::connect(browser_ws_url).await.map_err(Status::unavailable)?;
    let created = client
        .call("", "Target.createTarget", json!({ "url": "about:blank", "background": true }))
        .await
        .map_err(Status::unavailable)?;
    let target = created["targetId"].as_str().unwrap_or_default().to_owned();
    let described = async {
        let attached = client
            .call("", "Target.attachToTarget", json!({ "targetId": target, "flatten": true }))
            .await
            .map_err(Status::unavailable)?;
        let session = attached["sessionId"].as_str().unwrap_or_default().to_owned();
        let expression = format!("({DESCRIBE})(\n{source}\n)");
        let answer = evaluate(&mut client, &session, &expression, 10_000).await?;
        answer
            .map_err(|error| {
                Status::invalid_argument(format!("evaluating the source failed: {error}"))
            })?
            .as_array()
            .cloned()
            .ok_or_else(|| Status::invalid_argument("the source did not evaluate to an array"))
    }
    .await;
    let _ = client.call("", "Target.closeTarget", json!({ "targetId": target })).await;
    described
}

/// Evaluates `expression` in a session's page (awaiting a promise), answering its value
/// or the text of what it threw.
pub async fn evaluate(
    client: &mut CdpClient, session: &str, expression: &str, timeout_ms: u64,
) -> Result<Result<Value, String>, Status> {
    let answer = client
        .call(
            session,
            "Runtime.evaluate",
            json!({ "expression": expression, "awaitPromise": true, "returnByValue": true,
                    "timeout": timeout_ms, "userGesture": true }),
        )
        .await
        .map_err(|error| Status::unavailable(format!("the page did not evaluate: {error}")))?;
    if let Some(exception) = answer.get("exceptionDetails") {
        let text = exception["exception"]["description"]
            .as_str()
            .or_else(|| exception["text"].as_str())
            .unwrap_or("it threw");
        return Ok(Err(text.to_owned()));
    }
    Ok(Ok(answer["result"]["value"].clone()))
}

/// The expression that calls a kept `execute` with `input` in the page.
pub fn call_expression(definition: &Definition, input: &Value) -> String {
    format!(
        "(async () => {{ const execute = ({RESOLVE})({source}); return await execute({input}); }})()",
        source = json!(definition.execute),
    )
}

/// Whether `url` (without its fragment) matches a pattern: `*` stands for any run of
/// characters, everything else for itself.
pub fn matches(pattern: &str, url: &str) -> bool {
    let url = url.split('#').next().unwrap_or_default();
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = url.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (index, part) in parts.iter().enumerate() {
        if index == parts.len() - 1 {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_with_stars_only() {
        assert!(matches("https://example.com/*", "https://example.com/a/b?c#d"));
        assert!(matches("*://*.example.com/*", "https://shop.example.com/cart"));
        assert!(!matches("https://example.com/*", "https://example.org/"));
        assert!(matches("http://127.0.0.1:*/tools.html", "http://127.0.0.1:8080/tools.html"));
        assert!(!matches("http://127.0.0.1:*/tools.html", "http://127.0.0.1:8080/other.html"));
        assert!(matches("https://exact.test/", "https://exact.test/#fragment"));
        assert!(!matches("https://exact.test/", "https://exact.test/more"));
    }

    #[test]
    fn a_definition_needs_page_kind_patterns_and_a_name() {
        let good = json!({ "kind": "page", "match": { "url_patterns": ["*"] },
                           "tool": { "name": "t", "description": "d" }, "execute": "async () => 1" });
        let definition = checked(0, "ns", &good).map_err(|status| status.message().to_owned());
        assert_eq!(
            definition.map(|d| (d.namespace, d.tool["inputSchema"].clone())),
            Ok(("ns".into(), json!({ "type": "object" })))
        );
        for bad in [
            json!({ "kind": "cdp", "match": { "url_patterns": ["*"] }, "tool": { "name": "t", "description": "d" } }),
            json!({ "kind": "page", "match": { "url_patterns": [] }, "tool": { "name": "t", "description": "d" } }),
            json!({ "kind": "page", "match": { "url_patterns": [1] }, "tool": { "name": "t", "description": "d" } }),
            json!({ "kind": "page", "match": { "url_patterns": ["*"] }, "tool": { "description": "d" } }),
        ] {
            assert!(checked(0, "ns", &bad).is_err(), "{bad}");
        }
    }
}
