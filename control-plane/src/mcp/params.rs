//! The MCP tools' inputs: their JSON schemas (from these types and their doc comments) are
//! what models read to call the tools.

use rmcp::schemars;
use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum BrowserAction {
    Create,
    List,
    Get,
    Delete,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ManageBrowsersParams {
    /// `create` a browser, `list` the live ones, `get` one's details, `delete` one when
    /// finished (its session ends at once).
    pub action: BrowserAction,
    /// (get, delete) The browser's session_id or name.
    pub session_id: Option<String>,
    /// (create) true: no display, less memory. Default false (headful, with live view).
    pub headless: Option<bool>,
    /// (create) Reduce automation fingerprints. Default false.
    pub stealth: Option<bool>,
    /// (create) Seconds without API calls or CDP connection before the browser is
    /// deleted: 10 to 259200, default 60.
    pub timeout_seconds: Option<i64>,
    /// (create) Profile to start from, by name; see `manage_profiles`.
    pub profile_name: Option<String>,
    /// (create) Save the browser's cookies and storage back into the profile when its
    /// session ends. Default false.
    pub save_profile_changes: Option<bool>,
    /// (create) Proxy to route traffic through, by id; see the proxies API.
    pub proxy_id: Option<String>,
    /// (create) Screen width in pixels (with `viewport_height`), e.g. 1280.
    pub viewport_width: Option<u32>,
    /// (create) Screen height in pixels (with `viewport_width`), e.g. 800.
    pub viewport_height: Option<u32>,
    /// (create) A URL opened in the first tab before the answer.
    pub start_url: Option<String>,
    /// (create) A name unique among live browsers, usable in place of session_id.
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct NavigateParams {
    pub session_id: String,
    /// Absolute URL to open in the browser's current tab.
    pub url: String,
    /// When navigation counts as done: `load` (default), `domcontentloaded`,
    /// `networkidle` or `commit`.
    pub wait_until: Option<String>,
    /// Navigation timeout in seconds, 1 to 300 (default 30).
    pub timeout_sec: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReadPageParams {
    pub session_id: String,
    /// CSS selector of the part to read (default `body`, the whole page).
    pub selector: Option<String>,
    /// Most characters of text returned (default 20000); the answer says if it was cut.
    pub max_characters: Option<usize>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PlaywrightParams {
    pub session_id: String,
    /// Body of an async function with `page`, `context` and `browser` in scope; the
    /// value you `return` is sent back (JSON). Example: `await page.goto('https://example.com');
    /// return await page.title();`. Return only what you need. At most 1 MiB.
    pub code: String,
    /// Seconds before the code is stopped, 1 to 3600 (default 60).
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ComputerActionParams {
    pub session_id: String,
    /// Actions run in order, each `{"type": T, T: {...}}` with T one of `click_mouse`
    /// {x, y, button?: left|right|middle, num_clicks?}, `move_mouse` {x, y},
    /// `type_text` {text, delay?}, `press_key` {keys: ["Ctrl+a", "Return"]},
    /// `scroll` {x, y, delta_x?, delta_y?}, `drag_mouse` {path: [[x, y], ...]},
    /// `sleep` {duration_ms}, or a last `{"type": "screenshot"}` that returns a PNG of the
    /// screen. Coordinates are screen pixels from the top left.
    pub actions: Vec<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ScreenshotParams {
    pub session_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecCommandParams {
    pub session_id: String,
    /// The program to run inside the browser's VM, e.g. `ls`; a line with spaces or shell
    /// syntax and no `args` runs in `sh -c`.
    pub command: String,
    /// Its arguments.
    pub args: Option<Vec<String>>,
    /// Absolute working directory (default `/home/kernel`).
    pub cwd: Option<String>,
    /// Seconds before it is killed, 1 to 3600 (default 60).
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ReplParams {
    pub session_id: String,
    /// JavaScript for the browser's persistent Node REPL (top-level await; bindings
    /// persist between calls; `page`, `context`, `browser` bound). Output comes from
    /// `repl.write(text)`, console methods and `repl.emitImage(bytes, mime_type)`.
    pub code: String,
    /// Start a fresh REPL before evaluating.
    pub reset: Option<bool>,
    /// Seconds before the REPL is stopped, 1 to 3600 (default 60).
    pub timeout_sec: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplayAction {
    Start,
    Stop,
    List,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ManageReplaysParams {
    /// `start` recording the browser's screen (and sound), `stop` a recording (the video
    /// is kept), `list` the browser's recordings with their view URLs.
    pub action: ReplayAction,
    pub session_id: String,
    /// (stop) The recording's replay_id.
    pub replay_id: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProfileAction {
    List,
    Get,
    Create,
    Delete,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ManageProfilesParams {
    /// Profiles keep cookies and storage between browsers: `list` them, `get` one,
    /// `create` an empty one (then create a browser with it and
    /// `save_profile_changes`), `delete` one.
    pub action: ProfileAction,
    /// (get, delete) The profile's id or name; (create) its name.
    pub profile: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PoolAction {
    List,
    Get,
    Acquire,
    Release,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ManagePoolsParams {
    /// Pools hold warm browsers: `list` them, `get` one, `acquire` a browser from one
    /// (answers its session_id; use it like any browser), `release` it when done.
    pub action: PoolAction,
    /// (get, acquire, release) The pool's id or name.
    pub pool: Option<String>,
    /// (release) The acquired browser's session_id.
    pub session_id: Option<String>,
    /// (release) Reset the browser and keep it in the pool (default true) rather than
    /// end it.
    pub reuse: Option<bool>,
    /// (acquire) Seconds to wait for a free browser, 0 to 300 (default 30).
    pub acquire_timeout_seconds: Option<i64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct TelemetryParams {
    pub session_id: String,
    /// Only these categories: `console`, `network`, `page`, `interaction`, ...
    pub categories: Option<Vec<String>>,
    /// Most events returned, 1 to 1000 (default 20), newest last.
    pub limit: Option<u32>,
    /// How far back: an RFC 3339 time or a duration such as `5m` (default `5m`).
    pub since: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WebmcpAction {
    List,
    Invoke,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WebmcpParams {
    /// `list` the tools the browser's pages register (every tab and frame), or `invoke`
    /// one by its tool_ref.
    pub action: WebmcpAction,
    pub session_id: String,
    /// (invoke) The tool_ref from `list`; stale once its page navigates.
    pub tool_ref: Option<String>,
    /// (invoke) The tool's input, matching its inputSchema.
    pub input: Option<serde_json::Map<String, Value>>,
    /// (invoke) Seconds to wait for the tool's answer, 1 to 3600 (default 60).
    pub timeout_sec: Option<i64>,
}
