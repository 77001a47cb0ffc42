//! `LiveView`: a viewer's stream of screen updates (and sound, once it asks), and its
//! input played on the display.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use browser_agent_proto::v1::{LiveViewInput, LiveViewUpdate, live_pointer, live_view_input::Kind};
use enigo::Button;
use futures::{Stream, StreamExt};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use crate::desktop::Desktop;
use crate::input::{Action, ClickKind, Input};
use crate::live::{LiveView, Subscription, audio};

/// Keys a viewer may hold down at once (a hand has ten fingers).
const MAX_KEYS_DOWN: usize = 10;

pub type LiveStream = Pin<Box<dyn Stream<Item = Result<LiveViewUpdate, Status>> + Send>>;

type Outbound = mpsc::Sender<Result<LiveViewUpdate, Status>>;

/// Joins the display's encoder and plays the viewer's input until the viewer leaves.
pub async fn open(
    live: Arc<LiveView>, input: Input, desktop: Arc<Desktop>, inbound: Streaming<LiveViewInput>,
) -> Result<LiveStream, Status> {
    let joined = live.clone();
    let Subscription { updates, refresh } = tokio::task::spawn_blocking(move || joined.subscribe())
        .await
        .map_err(|error| Status::internal(format!("live view task failed: {error}")))?
        .map_err(Status::unavailable)?;
    let (outbound, receiver) = mpsc::channel(4);
    // The stream ends with the encoder's (a reset, a failed display), even while the
    // viewer's input and sound tasks still hold senders.
    let ended = CancellationToken::new();
    tokio::spawn(forward_screen(updates, refresh.clone(), outbound.clone(), ended.clone()));
    let viewer = Viewer { input, desktop, live, refresh, outbound, sound: None };
    tokio::spawn(viewer.play_input(inbound, ended.clone()));
    Ok(Box::pin(ReceiverStream::new(receiver).take_until(ended.cancelled_owned())))
}

/// Sends the encoder's updates until the viewer has gone (also while nothing changes, so
/// that its share of the encoder ends with it).
async fn forward_screen(
    updates: broadcast::Receiver<crate::live::Update>, refresh: Arc<AtomicBool>,
    outbound: Outbound, ended: CancellationToken,
) {
    let _end_stream = ended.drop_guard();
    // Behind: the skipped tiles are lost, so the whole screen comes next.
    let behind = || refresh.store(true, Ordering::Relaxed);
    forward(updates, outbound, |update| (*update).clone(), behind).await;
}

/// Sends the VM's sound until stopped or the viewer has gone.
async fn forward_sound(chunks: broadcast::Receiver<audio::Chunk>, outbound: Outbound) {
    let update_of = |chunk: audio::Chunk| LiveViewUpdate {
        audio: chunk.to_vec(),
        audio_rate: audio::RATE,
        audio_channels: audio::CHANNELS,
        ..Default::default()
    };
    // A slow listener skips sound rather than falling further behind.
    forward(chunks, outbound, update_of, || {}).await;
}

/// Sends what `from` carries, as updates, until it closes or the viewer has gone;
/// `behind` is called when the viewer fell behind and missed some.
async fn forward<T: Clone>(
    mut from: broadcast::Receiver<T>, outbound: Outbound, update_of: impl Fn(T) -> LiveViewUpdate,
    behind: impl Fn(),
) {
    loop {
        let received = tokio::select! {
            () = outbound.closed() => return,
            received = from.recv() => received,
        };
        match received {
            Ok(item) => {
                if outbound.send(Ok(update_of(item))).await.is_err() {
                    return;
                }
            }
            Err(RecvError::Lagged(_)) => behind(),
            Err(RecvError::Closed) => return,
        }
    }
}

struct Viewer {
    input: Input,
    desktop: Arc<Desktop>,
    live: Arc<LiveView>,
    refresh: Arc<AtomicBool>,
    outbound: Outbound,
    /// The task sending sound, while the viewer listens.
    sound: Option<JoinHandle<()>>,
}

impl Viewer {
    /// Plays the viewer's input in order. Input the display refuses (an unknown key, a
    /// point off a screen that just shrank) is skipped: a viewer's stale event must not
    /// end its view. Keys and buttons the viewer left down are released when it leaves.
    async fn play_input(mut self, mut inbound: Streaming<LiveViewInput>, ended: CancellationToken) {
        let mut keys_down = HashSet::new();
        let mut buttons_down = HashSet::new();
        loop {
            // A viewer whose stream has ended (a reset) has no more say over the display.
            let message = tokio::select! {
                () = ended.cancelled() => break,
                message = inbound.next() => message,
            };
            let Some(Ok(message)) = message else { break };
            let action = match message.kind {
                Some(Kind::Refresh(_)) => {
                    self.refresh.store(true, Ordering::Relaxed);
                    continue;
                }
                Some(Kind::Audio(on)) => {
                    self.listen(on).await;
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
                    // Unknown keys are skipped before they are counted as held.
                    if crate::input::key_named(&key.key).is_err() {
                        continue;
                    }
                    if !key.down {
                        keys_down.remove(&key.key);
                    } else if keys_down.len() < MAX_KEYS_DOWN {
                        keys_down.insert(key.key.clone());
                    } else {
                        continue;
                    }
                    Action::Key { name: key.key, down: key.down }
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
                    let desktop = self.desktop.clone();
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
            if let Err(error) = self.input.run(action).await {
                tracing::debug!(%error, "live view input skipped");
            }
        }
        self.listen(false).await;
        for name in keys_down {
            let _ = self.input.run(Action::Key { name, down: false }).await;
        }
        for held in buttons_down {
            let (x, y) = self.input.run(Action::Position).await.unwrap_or((0, 0));
            let _ = self.input.run(click(x, y, button(held), ClickKind::Up)).await;
        }
    }

    /// Starts or stops sending the VM's sound to this viewer.
    async fn listen(&mut self, on: bool) {
        if let Some(sending) = self.sound.take() {
            sending.abort();
        }
        let Some(sound) = self.live.audio.clone().filter(|_| on) else {
            return;
        };
        match tokio::task::spawn_blocking(move || sound.subscribe()).await {
            Ok(Ok(chunks)) => {
                self.sound = Some(tokio::spawn(forward_sound(chunks, self.outbound.clone())));
            }
            Ok(Err(error)) => tracing::warn!(%error, "the live view's sound could not start"),
            Err(error) => tracing::warn!(%error, "the live view's sound could not start"),
        }
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
    Action::Click { x, y, button, kind, count: 1, hold: Vec::new() }
}
