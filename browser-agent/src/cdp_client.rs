//! A small client of Chromium's DevTools protocol, for the agent's own short
//! conversations with the browser (curl): commands with ids, their answers, and the
//! events that arrive meanwhile, kept in order for the caller to read.

use std::collections::VecDeque;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::cdp::MAX_CDP_MESSAGE_BYTES;

/// An event of a target's session (`session` empty for the browser's own).
#[derive(Debug)]
pub struct Event {
    pub session: String,
    pub method: String,
    pub params: Value,
}

/// What arrived: an answer to a command, or an event.
#[derive(Debug)]
pub enum Incoming {
    Answer { id: u64, result: Result<Value, String> },
    Event(Event),
}

pub struct CdpClient {
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Events whose method this refuses are dropped unread (their params never parsed):
    /// a monitor that enabled a domain for a few of its events skips the rest cheaply.
    wanted: Option<fn(&str) -> bool>,
    next_id: u64,
    /// Events read while waiting for an answer, and answers read while waiting for an
    /// event, in arrival order.
    queued: VecDeque<Incoming>,
}

impl CdpClient {
    pub async fn connect(browser_ws_url: &str) -> Result<Self, String> {
        let mut config = WebSocketConfig::default();
        config.max_message_size = Some(MAX_CDP_MESSAGE_BYTES);
        config.max_frame_size = Some(MAX_CDP_MESSAGE_BYTES);
        let (socket, _) =
            tokio_tungstenite::connect_async_with_config(browser_ws_url, Some(config), true)
                .await
                .map_err(|error| format!("connecting to DevTools failed: {error}"))?;
        Ok(Self { socket, wanted: None, next_id: 1, queued: VecDeque::new() })
    }

    /// Only events whose method `wanted` accepts are read from now on.
    pub fn only_events(&mut self, wanted: fn(&str) -> bool) {
        self.wanted = Some(wanted);
    }

    /// Sends a command (to a target's `session`, or the browser's with an empty one)
    /// without waiting for its answer; answers its id.
    pub async fn send(
        &mut self, session: &str, method: &str, params: Value,
    ) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !session.is_empty() {
            message["sessionId"] = Value::String(session.to_owned());
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .map_err(|error| format!("DevTools connection failed: {error}"))?;
        Ok(id)
    }

    /// Sends a command and waits for its answer; events meanwhile are kept for `next`.
    pub async fn call(
        &mut self, session: &str, method: &str, params: Value,
    ) -> Result<Value, String> {
        let id = self.send(session, method, params).await?;
        let mut arrived = Vec::new();
        let answer = loop {
            match self.read().await? {
                Incoming::Answer { id: answered, result } if answered == id => break result,
                other => arrived.push(other),
            }
        };
        self.queued.extend(arrived);
        answer.map_err(|error| format!("{method}: {error}"))
    }

    /// The answers and events kept for `next`, taken.
    pub fn take_queued(&mut self) -> Vec<Incoming> {
        self.queued.drain(..).collect()
    }

    /// The next answer or event, the kept ones first.
    pub async fn next(&mut self) -> Result<Incoming, String> {
        match self.queued.pop_front() {
            Some(incoming) => Ok(incoming),
            None => self.read().await,
        }
    }

    /// The events kept for `next`, not taken.
    pub fn queued_events(&self) -> impl Iterator<Item = &Event> {
        self.queued.iter().filter_map(|incoming| match incoming {
            Incoming::Event(event) => Some(event),
            Incoming::Answer { .. } => None,
        })
    }

    async fn read(&mut self) -> Result<Incoming, String> {
        loop {
            let message = self
                .socket
                .next()
                .await
                .ok_or("DevTools closed the connection")?
                .map_err(|error| format!("DevTools connection failed: {error}"))?;
            let text = match message {
                Message::Text(text) => text,
                Message::Close(_) => return Err("DevTools closed the connection".into()),
                _ => continue,
            };
            let envelope: Envelope<'_> = serde_json::from_str(text.as_str())
                .map_err(|error| format!("DevTools sent nonsense: {error}"))?;
            if let Some(id) = envelope.id {
                let result = match envelope.error {
                    Some(error) => Err(error["message"].as_str().unwrap_or("failed").to_owned()),
                    None => Ok(parse(envelope.result)?),
                };
                return Ok(Incoming::Answer { id, result });
            }
            let method = envelope.method.unwrap_or_default();
            if self.wanted.is_some_and(|wanted| !wanted(&method)) {
                continue;
            }
            return Ok(Incoming::Event(Event {
                session: envelope.session_id.map(|s| s.into_owned()).unwrap_or_default(),
                method: method.into_owned(),
                params: parse(envelope.params)?,
            }));
        }
    }
}

/// A DevTools message, its payload left unparsed until it is wanted.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    id: Option<u64>,
    #[serde(borrow)]
    method: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, rename = "sessionId")]
    session_id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    params: Option<&'a serde_json::value::RawValue>,
    #[serde(borrow)]
    result: Option<&'a serde_json::value::RawValue>,
    error: Option<Value>,
}

fn parse(raw: Option<&serde_json::value::RawValue>) -> Result<Value, String> {
    match raw {
        None => Ok(Value::Null),
        Some(raw) => serde_json::from_str(raw.get())
            .map_err(|error| format!("DevTools sent nonsense: {error}")),
    }
}
