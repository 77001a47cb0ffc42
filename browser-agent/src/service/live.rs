//! `LiveView`: a viewer's stream of screen updates, and its input played on the display.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use browser_agent_proto::v1::{LiveViewInput, LiveViewUpdate, live_pointer, live_view_input::Kind};
use enigo::Button;
use futures::{Stream, StreamExt};
use tokio::sync::broadcast::error::RecvError;
use tonic::{Status, Streaming};

use crate::desktop::Desktop;
use crate::input::{Action, ClickKind, Input};
use crate::live::{LiveView, Subscription};

pub type LiveStream = Pin<Box<dyn Stream<Item = Result<LiveViewUpdate, Status>> + Send>>;

/// Joins the display's encoder and plays the viewer's input until the viewer leaves.
pub async fn open(
    live: Arc<LiveView>,
    input: Input,
    desktop: Arc<Desktop>,
    inbound: Streaming<LiveViewInput>,
) -> Result<LiveStream, Status> {
    let Subscription { updates, refresh } = tokio::task::spawn_blocking(move || live.subscribe())
        .await
        .map_err(|error| Status::internal(format!("live view task failed: {error}")))?
        .map_err(Status::unavailable)?;
    let asked_refresh = refresh.clone();
    tokio::spawn(play_input(inbound, input, desktop, move || {
        asked_refresh.store(true, Ordering::Relaxed);
    }));
    let stream = futures::stream::unfold(updates, move |mut updates| {
        let refresh = refresh.clone();
        async move {
            loop {
                match updates.recv().await {
                    Ok(update) => return Some((Ok((*update).clone()), updates)),
                    // Behind: the skipped tiles are lost, so the whole screen comes next.
                    Err(RecvError::Lagged(_)) => refresh.store(true, Ordering::Relaxed),
                    Err(RecvError::Closed) => return None,
                }
            }
        }
    });
    Ok(Box::pin(stream))
}

/// Plays the viewer's input in order. Input the display refuses (an unknown key, a point
/// off a screen that just shrank) is skipped: a viewer's stale event must not end its
/// view. Keys and buttons the viewer left down are released when it leaves.
async fn play_input(
    mut inbound: Streaming<LiveViewInput>,
    input: Input,
    desktop: Arc<Desktop>,
    refresh: impl Fn(),
) {
    let mut keys_down = HashSet::new();
    let mut buttons_down = HashSet::new();
    while let Some(Ok(message)) = inbound.next().await {
        let action = match message.kind {
            Some(Kind::Refresh(_)) => {
                refresh();
                continue;
            }
            Some(Kind::Pointer(pointer)) => {
                let button = button(pointer.button);
                match live_pointer::Action::try_from(pointer.action) {
                    Ok(live_pointer::Action::Down) => {
                        buttons_down.insert(pointer.button);
                        click(pointer.x, pointer.y, button, ClickKind::Down)
                    }
                    Ok(live_pointer::Action::Up) => {
                        buttons_down.remove(&pointer.button);
                        click(pointer.x, pointer.y, button, ClickKind::Up)
                    }
                    _ => Action::Move {
                        x: pointer.x,
                        y: pointer.y,
                        smooth: None,
                        hold: Vec::new(),
                    },
                }
            }
            Some(Kind::Key(key)) => {
                if key.down {
                    keys_down.insert(key.key.clone());
                } else {
                    keys_down.remove(&key.key);
                }
                Action::Key {
                    name: key.key,
                    down: key.down,
                }
            }
            Some(Kind::Wheel(wheel)) => Action::Scroll {
                x: wheel.x,
                y: wheel.y,
                delta_x: wheel.delta_x,
                delta_y: wheel.delta_y,
                hold: Vec::new(),
            },
            Some(Kind::Text(text)) => Action::Type { text, delay_ms: 0 },
            Some(Kind::Paste(text)) => {
                let desktop = desktop.clone();
                let written =
                    tokio::task::spawn_blocking(move || desktop.write_clipboard(&text)).await;
                if !matches!(written, Ok(Ok(()))) {
                    tracing::debug!("a live view paste could not reach the clipboard");
                    continue;
                }
                Action::PressKeys {
                    keys: vec!["ctrl+v".into()],
                    duration_ms: 0,
                    hold: Vec::new(),
                }
            }
            None => continue,
        };
        if let Err(error) = input.run(action).await {
            tracing::debug!(%error, "live view input skipped");
        }
    }
    for name in keys_down {
        let _ = input.run(Action::Key { name, down: false }).await;
    }
    for held in buttons_down {
        let (x, y) = input.run(Action::Position).await.unwrap_or((0, 0));
        let _ = input.run(click(x, y, button(held), ClickKind::Up)).await;
    }
}

fn button(number: u32) -> Button {
    match number {
        2 => Button::Middle,
        3 => Button::Right,
        _ => Button::Left,
    }
}

fn click(x: i32, y: i32, button: Button, kind: ClickKind) -> Action {
    Action::Click {
        x,
        y,
        button,
        kind,
        count: 1,
        hold: Vec::new(),
    }
}
