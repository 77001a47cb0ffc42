//! OS-level mouse and keyboard on the X display, through enigo (text through
//! `keyboard::Typist`). One dedicated thread owns both (enigo is not `Send`-friendly and X
//! input must stay ordered); requests are serialized through a channel to it.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use enigo::{Axis, Button, Coordinate, Direction, Enigo, Key, Keyboard, Mouse, Settings};
use tokio::sync::oneshot;

use crate::keyboard::{Layout, Typist};
use crate::motion;

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A bad request: unknown key, coordinates off the screen.
    #[error("{0}")]
    Invalid(String),
    #[error("input on the X display failed: {0}")]
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClickKind {
    Click,
    Down,
    Up,
}

#[derive(Debug)]
pub enum Action {
    Click {
        x: i32,
        y: i32,
        button: Button,
        kind: ClickKind,
        count: u32,
        hold: Vec<String>,
    },
    Move {
        x: i32,
        y: i32,
        /// Along a curve taking this many ms (0: from the distance) instead of a jump.
        smooth: Option<u32>,
        hold: Vec<String>,
    },
    Drag {
        path: Vec<(i32, i32)>,
        button: Button,
        delay_ms: u32,
        steps: u32,
        step_delay_ms: u32,
        /// Curves taking this many ms in all (0: from the length) instead of steps.
        smooth: Option<u32>,
        hold: Vec<String>,
    },
    Type {
        text: String,
        delay_ms: u32,
    },
    PressKeys {
        keys: Vec<String>,
        duration_ms: u32,
        hold: Vec<String>,
    },
    Scroll {
        x: i32,
        y: i32,
        delta_x: i32,
        delta_y: i32,
        hold: Vec<String>,
    },
    Position,
    /// One key (by `key_named`) going down or up, as a live viewer's keyboard sends them.
    Key {
        name: String,
        down: bool,
    },
    /// Waits, in a batch.
    Sleep {
        ms: u32,
    },
}

/// X timestamps have millisecond resolution and Chromium does not count a press with the
/// same timestamp as the previous one as a repeat: without a gap, two clicks in the same
/// millisecond would never make a double click.
const REPEATED_CLICK_GAP: Duration = Duration::from_millis(3);

fn open_devices(display: &str, layout: &Layout) -> Result<(Enigo, Typist), InputError> {
    let enigo = Enigo::new(&Settings {
        // The default 12 ms makes every click cost 25 ms; Chromium still registers every
        // event without it.
        linux_delay: 0,
        x11_display: Some(display.to_owned()),
        ..Settings::default()
    })
    .map_err(|error| InputError::Failed(error.to_string()))?;
    let typist =
        Typist::new(display, layout).map_err(|error| InputError::Failed(format!("{error:#}")))?;
    Ok((enigo, typist))
}

type Request = (Action, oneshot::Sender<Result<(i32, i32), InputError>>);

/// Sends actions to the input thread of one display.
#[derive(Clone)]
pub struct Input {
    sender: std::sync::mpsc::Sender<Request>,
    screen: std::sync::Arc<crate::screen::Screen>,
}

impl Input {
    pub fn start(
        display: &str, layout: Layout, screen: std::sync::Arc<crate::screen::Screen>,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = std::sync::mpsc::channel::<Request>();
        let display = display.to_owned();
        thread::Builder::new().name("input".into()).spawn(move || {
            // Created on first use, so a failure is reported to a caller, not lost.
            let mut devices: Option<(Enigo, Typist)> = None;
            for (action, reply) in receiver {
                // A caller that gave up (timeout, disconnect) must not have its action
                // performed later, behind others' backs.
                if reply.is_closed() {
                    continue;
                }
                let outcome = match &mut devices {
                    Some((enigo, typist)) => perform(enigo, typist, action),
                    None => match open_devices(&display, &layout) {
                        Ok(opened) => {
                            let (enigo, typist) = devices.insert(opened);
                            perform(enigo, typist, action)
                        }
                        Err(error) => Err(error),
                    },
                };
                let _ = reply.send(outcome);
            }
        })?;
        Ok(Self { sender, screen })
    }

    /// Runs one action; `Action::Position` answers the pointer position, others (0, 0).
    pub async fn run(&self, action: Action) -> Result<(i32, i32), InputError> {
        self.check_bounds(&action)?;
        let (reply, answer) = oneshot::channel();
        self.sender
            .send((action, reply))
            .map_err(|_| InputError::Failed("the input thread has stopped".into()))?;
        answer.await.map_err(|_| InputError::Failed("the input thread has stopped".into()))?
    }

    fn check_bounds(&self, action: &Action) -> Result<(), InputError> {
        let points: Vec<(i32, i32)> = match action {
            Action::Click { x, y, .. }
            | Action::Move { x, y, .. }
            | Action::Scroll { x, y, .. } => vec![(*x, *y)],
            Action::Drag { path, .. } => path.clone(),
            Action::Type { .. }
            | Action::PressKeys { .. }
            | Action::Key { .. }
            | Action::Position
            | Action::Sleep { .. } => vec![],
        };
        let (width, height) = self.screen.size();
        for (x, y) in points {
            if x < 0 || y < 0 || x as u32 >= width || y as u32 >= height {
                return Err(InputError::Invalid(format!(
                    "({x}, {y}) is outside the {width}x{height} screen"
                )));
            }
        }
        Ok(())
    }
}

fn failed(error: enigo::InputError) -> InputError {
    InputError::Failed(error.to_string())
}

fn perform(
    enigo: &mut Enigo, typist: &mut Typist, action: Action,
) -> Result<(i32, i32), InputError> {
    let is_position = matches!(action, Action::Position);
    let hold = match &action {
        Action::Click { hold, .. }
        | Action::Move { hold, .. }
        | Action::Drag { hold, .. }
        | Action::PressKeys { hold, .. }
        | Action::Scroll { hold, .. } => {
            hold.iter().map(|name| key_named(name)).collect::<Result<Vec<_>, _>>()?
        }
        Action::Type { .. } | Action::Key { .. } | Action::Position | Action::Sleep { .. } => {
            Vec::new()
        }
    };
    // Parse everything before touching the display, so a bad key changes nothing.
    let combos = match &action {
        Action::PressKeys { keys, .. } => {
            keys.iter().map(|combo| combo_keys(combo)).collect::<Result<Vec<_>, _>>()?
        }
        _ => Vec::new(),
    };
    let mut pressed = Vec::new();
    let mut outcome = Ok(());
    for key in &hold {
        if let Err(error) = enigo.key(*key, Direction::Press) {
            outcome = Err(failed(error));
            break;
        }
        pressed.push(*key);
    }
    if outcome.is_ok() {
        outcome = act(enigo, typist, action, &combos);
    }
    // Hold keys are released whatever happened.
    for key in pressed.iter().rev() {
        let _ = enigo.key(*key, Direction::Release);
    }
    outcome?;
    // enigo syncs with the X server after every event, so the action is complete here;
    // only a position query needs another round trip.
    if is_position { enigo.location().map_err(failed) } else { Ok((0, 0)) }
}

fn act(
    enigo: &mut Enigo, typist: &mut Typist, action: Action, combos: &[Vec<Key>],
) -> Result<(), InputError> {
    match action {
        Action::Click { x, y, button, kind, count, .. } => {
            enigo.move_mouse(x, y, Coordinate::Abs).map_err(failed)?;
            match kind {
                ClickKind::Down => enigo.button(button, Direction::Press).map_err(failed),
                ClickKind::Up => enigo.button(button, Direction::Release).map_err(failed),
                ClickKind::Click => {
                    for index in 0..count.max(1) {
                        if index > 0 {
                            thread::sleep(REPEATED_CLICK_GAP);
                        }
                        enigo.button(button, Direction::Click).map_err(failed)?;
                    }
                    Ok(())
                }
            }
        }
        Action::Move { x, y, smooth: Some(duration_ms), .. } => {
            let from = enigo.location().map_err(failed)?;
            let duration = chosen_duration(duration_ms, motion::distance(from, (x, y)));
            follow(enigo, motion::curve(from, (x, y), duration))
        }
        Action::Move { x, y, .. } => enigo.move_mouse(x, y, Coordinate::Abs).map_err(failed),
        Action::Drag { path, button, delay_ms, steps, step_delay_ms, smooth, .. } => {
            let Some(&(start_x, start_y)) = path.first() else {
                return Err(InputError::Invalid("path needs at least 2 points".into()));
            };
            enigo.move_mouse(start_x, start_y, Coordinate::Abs).map_err(failed)?;
            enigo.button(button, Direction::Press).map_err(failed)?;
            let moved = (|| {
                sleep_ms(delay_ms);
                if let Some(duration_ms) = smooth {
                    return follow(enigo, smooth_drag(&path, duration_ms));
                }
                let mut first = true;
                for segment in path.windows(2) {
                    let (dx, dy) = (segment[1].0 - segment[0].0, segment[1].1 - segment[0].1);
                    for (step_x, step_y) in drag_steps(dx, dy, steps) {
                        if !first {
                            sleep_ms(step_delay_ms);
                        }
                        first = false;
                        enigo.move_mouse(step_x, step_y, Coordinate::Rel).map_err(failed)?;
                    }
                }
                Ok(())
            })();
            // The button goes up even when a move failed.
            let released = enigo.button(button, Direction::Release).map_err(failed);
            moved.and(released)
        }
        Action::Type { text, delay_ms } => {
            // One line break, one Return.
            let text = text.replace("\r\n", "\n");
            for (index, character) in text.chars().enumerate() {
                if index > 0 {
                    sleep_ms(delay_ms);
                }
                typist
                    .type_char(character)
                    .map_err(|error| InputError::Failed(format!("{error:#}")))?;
            }
            Ok(())
        }
        Action::PressKeys { duration_ms, .. } => {
            for combo in combos {
                let mut down = Vec::new();
                let mut result = Ok(());
                for key in combo {
                    if let Err(error) = enigo.key(*key, Direction::Press) {
                        result = Err(failed(error));
                        break;
                    }
                    down.push(*key);
                }
                if result.is_ok() {
                    sleep_ms(duration_ms);
                }
                for key in down.iter().rev() {
                    let _ = enigo.key(*key, Direction::Release);
                }
                result?;
            }
            Ok(())
        }
        Action::Scroll { x, y, delta_x, delta_y, .. } => {
            enigo.move_mouse(x, y, Coordinate::Abs).map_err(failed)?;
            if delta_y != 0 {
                enigo.scroll(delta_y, Axis::Vertical).map_err(failed)?;
            }
            if delta_x != 0 {
                enigo.scroll(delta_x, Axis::Horizontal).map_err(failed)?;
            }
            Ok(())
        }
        Action::Sleep { ms } => {
            sleep_ms(ms);
            Ok(())
        }
        Action::Key { name, down } => {
            let direction = if down { Direction::Press } else { Direction::Release };
            enigo.key(key_named(&name)?, direction).map_err(failed)
        }
        Action::Position => Ok(()),
    }
}

/// The duration asked for, or one from the distance when none was (0).
fn chosen_duration(duration_ms: u32, distance: f64) -> Duration {
    if duration_ms > 0 {
        Duration::from_millis(duration_ms.into())
    } else {
        motion::default_duration(distance)
    }
}

/// A smooth drag's motion: a curve per segment, the duration shared by their lengths.
fn smooth_drag(path: &[(i32, i32)], duration_ms: u32) -> Vec<((i32, i32), Duration)> {
    let lengths: Vec<f64> =
        path.windows(2).map(|pair| motion::distance(pair[0], pair[1])).collect();
    let total_length: f64 = lengths.iter().sum();
    let total = chosen_duration(duration_ms, total_length);
    let mut points = Vec::new();
    let mut start = Duration::ZERO;
    for (pair, length) in path.windows(2).zip(&lengths) {
        let share = if total_length > 0.0 {
            total.mul_f64(length / total_length)
        } else {
            total / lengths.len().max(1) as u32
        };
        points.extend(
            motion::curve(pair[0], pair[1], share)
                .into_iter()
                .map(|(point, at)| (point, start + at)),
        );
        start += share;
    }
    points
}

/// Moves the pointer through the points, each at its time from now.
fn follow(enigo: &mut Enigo, points: Vec<((i32, i32), Duration)>) -> Result<(), InputError> {
    let start = Instant::now();
    for ((x, y), at) in points {
        if let Some(wait) = at.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
        enigo.move_mouse(x, y, Coordinate::Abs).map_err(failed)?;
    }
    Ok(())
}

fn sleep_ms(ms: u32) {
    if ms > 0 {
        thread::sleep(Duration::from_millis(ms.into()));
    }
}

/// The relative moves of one drag segment: `steps` moves whose sizes are the differences
/// of `round(i·d/steps)`, so they sum exactly to the segment.
pub fn drag_steps(dx: i32, dy: i32, steps: u32) -> Vec<(i32, i32)> {
    let steps = steps.max(1) as i64;
    let at = |delta: i32, i: i64| ((i * delta as i64) as f64 / steps as f64).round() as i32;
    (1..=steps).map(|i| (at(dx, i) - at(dx, i - 1), at(dy, i) - at(dy, i - 1))).collect()
}

/// "Ctrl+Shift+Tab" → its keys, pressed in order.
fn combo_keys(combo: &str) -> Result<Vec<Key>, InputError> {
    if combo.len() > 1 && combo.contains('+') {
        combo.split('+').map(key_named).collect()
    } else {
        Ok(vec![key_named(combo)?])
    }
}

/// Usual names (case-insensitive) first, then X keysym names, then a single character.
pub fn key_named(name: &str) -> Result<Key, InputError> {
    let alias = match name.to_ascii_lowercase().as_str() {
        "shift" | "lshift" => Some("Shift_L"),
        "rshift" => Some("Shift_R"),
        "ctrl" | "control" | "lctrl" => Some("Control_L"),
        "rctrl" => Some("Control_R"),
        "alt" | "lalt" | "option" => Some("Alt_L"),
        "ralt" | "altgr" => Some("Alt_R"),
        "super" | "meta" | "cmd" | "command" | "win" | "windows" => Some("Super_L"),
        "enter" | "return" => Some("Return"),
        "esc" | "escape" => Some("Escape"),
        "backspace" => Some("BackSpace"),
        "del" | "delete" => Some("Delete"),
        "tab" => Some("Tab"),
        "space" => Some("space"),
        "pageup" | "page_up" | "pgup" => Some("Prior"),
        "pagedown" | "page_down" | "pgdn" => Some("Next"),
        "up" | "arrowup" => Some("Up"),
        "down" | "arrowdown" => Some("Down"),
        "left" | "arrowleft" => Some("Left"),
        "right" | "arrowright" => Some("Right"),
        "home" => Some("Home"),
        "end" => Some("End"),
        "insert" => Some("Insert"),
        _ => None,
    };
    let table = keysyms();
    let keysym = alias
        .and_then(|alias| table.exact.get(alias))
        .or_else(|| table.exact.get(name))
        .or_else(|| table.folded.get(&name.to_ascii_lowercase()));
    if let Some(keysym) = keysym {
        return Ok(Key::Other(*keysym));
    }
    let mut characters = name.chars();
    match (characters.next(), characters.next()) {
        // Latin-1 characters are their own keysyms; others go through enigo's Unicode path.
        (Some(character), None) if matches!(character as u32, 0x20..=0x7e | 0xa0..=0xff) => {
            Ok(Key::Other(character as u32))
        }
        (Some(character), None) => Ok(Key::Unicode(character)),
        _ => Err(InputError::Invalid(format!("unknown key name {name:?}"))),
    }
}

struct KeysymTable {
    exact: HashMap<&'static str, u32>,
    /// Lowercased names; the first keysym of a name wins (so "a" stays the letter a).
    folded: HashMap<String, u32>,
}

/// Name → keysym for every keysym xkeysym knows, built once.
fn keysyms() -> &'static KeysymTable {
    static TABLE: OnceLock<KeysymTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut exact = HashMap::new();
        let mut folded = HashMap::new();
        let ranges = [0x0000_u32..0x1_0000, 0x1008_fe00..0x1009_0000];
        for value in ranges.into_iter().flatten() {
            if let Some(name) = xkeysym::Keysym::new(value).name() {
                let name = name.strip_prefix("XK_").unwrap_or(name);
                exact.entry(name).or_insert(value);
                folded.entry(name.to_ascii_lowercase()).or_insert(value);
            }
        }
        KeysymTable { exact, folded }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drag_steps_sum_exactly_to_the_segment() {
        for (dx, dy, steps) in [(100, -37, 10), (7, 3, 10), (-1, 0, 3), (0, 0, 1), (999, 1, 7)] {
            let moves = drag_steps(dx, dy, steps);
            assert_eq!(moves.len(), steps as usize);
            let sum = moves.iter().fold((0, 0), |acc, m| (acc.0 + m.0, acc.1 + m.1));
            assert_eq!(sum, (dx, dy));
        }
        assert_eq!(drag_steps(10, 0, 4), vec![(3, 0), (2, 0), (3, 0), (2, 0)]);
    }

    #[test]
    fn keys_are_found_by_usual_and_keysym_names() {
        assert_eq!(key_named("shift").ok(), Some(Key::Other(0xffe1)));
        assert_eq!(key_named("CTRL").ok(), Some(Key::Other(0xffe3)));
        assert_eq!(key_named("Return").ok(), Some(Key::Other(0xff0d)));
        assert_eq!(key_named("F5").ok(), Some(Key::Other(0xffc2)));
        assert_eq!(key_named("a").ok(), Some(Key::Other(0x61)));
        assert_eq!(key_named("A").ok(), Some(Key::Other(0x41)));
        assert!(
            matches!(key_named("NoSuchKey"), Err(InputError::Invalid(message)) if message.contains("NoSuchKey"))
        );
        assert_eq!(combo_keys("Ctrl+t").ok(), Some(vec![Key::Other(0xffe3), Key::Other(0x74)]));
        assert_eq!(combo_keys("+").ok(), Some(vec![Key::Other(0x2b)]));
    }
}
