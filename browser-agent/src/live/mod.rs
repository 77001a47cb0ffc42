//! The live view's encoder: one thread per display, shared by every viewer (every open
//! `LiveView` stream), started by the first and ended when the last leaves. It sends
//! what the screen changed, at most [`MAX_FPS`] times a second, and where the pointer
//! is; a viewer that joins or falls behind asks for the whole screen.

pub mod audio;
pub mod capture;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use browser_agent_proto::v1::{LiveTile, LiveViewUpdate};
use tokio::sync::broadcast;

use crate::screen::Screen;
use capture::DamageCapture;

/// Frames per second at most: a page animating all the time is sent at this rate.
pub const MAX_FPS: u32 = 30;
const MIN_FRAME_INTERVAL: Duration = Duration::from_millis(1000 / MAX_FPS as u64);
/// Longest wait for the X server between looks at the pointer and at the viewers. Damage
/// wakes the encoder at once; an idle screen costs a wake-up per tick.
const TICK: Duration = Duration::from_millis(33);
/// How often a viewer's request for the whole screen is looked at while nothing is drawn.
const REFRESH_CHECK: Duration = Duration::from_millis(10);
/// How often the pointer's position is read while the screen is unchanged.
const POINTER_INTERVAL: Duration = Duration::from_millis(33);
/// Updates a viewer may be behind before it skips them and gets the whole screen.
const BACKLOG: usize = 8;
/// Capture errors in a row (e.g. while the screen is being resized) that end the view.
const ERRORS_TOLERATED: u32 = 3;

pub type Update = Arc<LiveViewUpdate>;

/// A viewer's share of the encoder.
pub struct Subscription {
    pub updates: broadcast::Receiver<Update>,
    /// Set to have the whole screen sent next.
    pub refresh: Arc<AtomicBool>,
}

struct Running {
    updates: broadcast::Sender<Update>,
    refresh: Arc<AtomicBool>,
    /// Set to end the encoder (and so every viewer's stream) at once.
    stop: Arc<AtomicBool>,
}

pub struct LiveView {
    display: String,
    screen: Arc<Screen>,
    running: Mutex<Option<Running>>,
    /// The VM's sound; `None` without a sound server.
    pub audio: Option<Arc<audio::LiveAudio>>,
}

impl LiveView {
    pub fn new(display: String, screen: Arc<Screen>, audio: Option<audio::LiveAudio>) -> Self {
        Self { display, screen, running: Mutex::new(None), audio: audio.map(Arc::new) }
    }

    /// Joins the running encoder, or starts it. Blocking (it may connect to the display).
    pub fn subscribe(self: &Arc<Self>) -> Result<Subscription, String> {
        let mut running =
            self.running.lock().map_err(|_| "the live view's lock is poisoned".to_owned())?;
        if let Some(running) = running.as_ref() {
            // Subscribed first: the whole screen it asks for must not go out before.
            let updates = running.updates.subscribe();
            running.refresh.store(true, Ordering::Relaxed);
            return Ok(Subscription { updates, refresh: running.refresh.clone() });
        }
        let capture = DamageCapture::connect(&self.display, self.screen.size())?;
        let (updates, receiver) = broadcast::channel(BACKLOG);
        let refresh = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let encoder = Encoder {
            hub: self.clone(),
            capture,
            updates: updates.clone(),
            refresh: refresh.clone(),
            stop: stop.clone(),
        };
        std::thread::Builder::new()
            .name("live-view".into())
            .spawn(move || encoder.run())
            .map_err(|error| format!("starting the live view's encoder: {error}"))?;
        *running = Some(Running { updates, refresh: refresh.clone(), stop });
        Ok(Subscription { updates: receiver, refresh })
    }

    /// Ends every viewer's stream (and their sound): a pool browser's next lessee must
    /// not be watched by the previous one's viewers. Later viewers start anew.
    pub fn disconnect_all(&self) {
        if let Ok(mut running) = self.running.lock()
            && let Some(running) = running.take()
        {
            running.stop.store(true, Ordering::Relaxed);
        }
        if let Some(audio) = &self.audio {
            audio.disconnect_all();
        }
    }
}

struct Encoder {
    hub: Arc<LiveView>,
    capture: DamageCapture,
    updates: broadcast::Sender<Update>,
    refresh: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Encoder {
    fn run(mut self) {
        let mut last_frame: Option<Instant> = None;
        let mut last_pointer_read = Instant::now();
        let mut pointer = (-1, -1);
        let mut errors = 0;
        loop {
            if self.stop.load(Ordering::Relaxed) || self.no_viewer_left() {
                return;
            }
            match self.step(&mut last_frame, &mut last_pointer_read, &mut pointer) {
                Ok(()) => errors = 0,
                Err(error) if errors + 1 < ERRORS_TOLERATED => {
                    errors += 1;
                    tracing::debug!(%error, "live view capture failed; retrying with the whole screen");
                    self.refresh.store(true, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::warn!(%error, "the live view's capture failed; its viewers are disconnected");
                    return;
                }
            }
            if let Err(error) = self.wait(last_frame) {
                tracing::warn!(%error, "the live view's capture failed; its viewers are disconnected");
                return;
            }
        }
    }

    /// Until the X server says something (damage), a refresh may be due, or the next frame
    /// may go out; at most a tick.
    fn wait(&mut self, last_frame: Option<Instant>) -> Result<(), String> {
        let pending_frame = last_frame
            .map(|at| MIN_FRAME_INTERVAL.saturating_sub(at.elapsed()))
            .filter(|left| !left.is_zero());
        match pending_frame {
            // Damage is waiting for the frame interval: sleep out the rest of it.
            Some(left) if self.capture.pending() => {
                std::thread::sleep(left);
                Ok(())
            }
            _ => self.capture.wait(REFRESH_CHECK.min(TICK)),
        }
    }

    /// Under the hub's lock, so no viewer can join an encoder that is about to end.
    fn no_viewer_left(&self) -> bool {
        match self.hub.running.lock() {
            Ok(mut running) if self.updates.receiver_count() == 0 => {
                *running = None;
                true
            }
            Ok(_) => false,
            Err(_) => true,
        }
    }

    fn step(
        &mut self, last_frame: &mut Option<Instant>, last_pointer_read: &mut Instant,
        pointer: &mut (i32, i32),
    ) -> Result<(), String> {
        let size = self.hub.screen.size();
        if (u32::from(self.capture.size().0), u32::from(self.capture.size().1)) != size {
            self.capture.resize(size)?;
            self.refresh.store(true, Ordering::Relaxed);
        }
        let damaged = self.capture.poll()?;
        let due = last_frame.is_none_or(|at| at.elapsed() >= MIN_FRAME_INTERVAL);
        // Taken only when a frame goes out now, so no request for it is lost.
        let whole = due && self.refresh.swap(false, Ordering::Relaxed);
        if (damaged || whole) && due {
            // Taken also when the whole screen goes out, to re-arm the monitor.
            let damage = self.capture.take_damage()?;
            let rect = if whole { Some(self.capture.whole_screen()) } else { damage };
            *last_frame = Some(Instant::now());
            if let Some(rect) = rect {
                let captured_at_us = now_us();
                let tiles = self.capture.encode(rect)?;
                *pointer = self.capture.pointer()?;
                *last_pointer_read = Instant::now();
                self.send(LiveViewUpdate {
                    tiles: tiles
                        .into_iter()
                        .map(|(band, jpeg)| LiveTile {
                            x: band.x.into(),
                            y: band.y.into(),
                            width: band.width.into(),
                            height: band.height.into(),
                            jpeg,
                        })
                        .collect(),
                    full: whole,
                    captured_at_us,
                    ..self.header(*pointer)
                });
            }
        } else if last_pointer_read.elapsed() >= POINTER_INTERVAL {
            *last_pointer_read = Instant::now();
            let now = self.capture.pointer()?;
            if now != *pointer {
                *pointer = now;
                self.send(LiveViewUpdate { captured_at_us: now_us(), ..self.header(now) });
            }
        }
        Ok(())
    }

    fn header(&self, (pointer_x, pointer_y): (i32, i32)) -> LiveViewUpdate {
        let (width, height) = self.capture.size();
        LiveViewUpdate {
            width: width.into(),
            height: height.into(),
            pointer_x,
            pointer_y,
            pointer_visible: !crate::desktop::cursor_hidden(),
            ..Default::default()
        }
    }

    fn send(&self, update: LiveViewUpdate) {
        // No receiver: the last viewer just left; the next loop ends the encoder.
        let _ = self.updates.send(Arc::new(update));
    }
}

impl Drop for Encoder {
    /// However the encoder ends (a panic included), the hub forgets it, so that the
    /// viewers' streams end (the last sender is gone) and the next viewer starts anew.
    fn drop(&mut self) {
        if let Ok(mut running) = self.hub.running.lock()
            && running.as_ref().is_some_and(|running| running.updates.same_channel(&self.updates))
        {
            *running = None;
        }
    }
}

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_micros() as u64)
}
