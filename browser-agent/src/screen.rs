//! The size of the VM's screen, which can change while the browser runs (PATCH
//! `viewport`). Xvfb starts with a framebuffer as large as the screen may ever become;
//! the screen itself is then sized with RandR within it, and Chromium's windows are made
//! to fill it (without a window manager nothing else would: Chromium's window does not
//! follow a screen change on its own). Everything that depends on the size (input
//! bounds, screenshots, new recordings, Chromium's next launch) reads it here.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use x11rb::connection::{Connection, RequestConnection};
use x11rb::protocol::randr::{self, ConnectionExt as _, ModeInfo};
use x11rb::protocol::xproto::{ConfigureWindowAux, ConnectionExt as _, MapState, Window};
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    #[error("{0}")]
    Invalid(String),
    #[error("resizing the screen failed: {0}")]
    Failed(String),
}

fn failed(what: &'static str) -> impl Fn(&dyn std::fmt::Display) -> ScreenError {
    move |error| ScreenError::Failed(format!("{what}: {error}"))
}

/// A request's reply; a failure to send it or an error reply is `what` failing.
fn ask<R: x11rb::x11_utils::TryParse>(
    what: &'static str,
    request: Result<x11rb::cookie::Cookie<'_, RustConnection, R>, x11rb::errors::ConnectionError>,
) -> Result<R, ScreenError> {
    let x_error = failed(what);
    request.map_err(|e| x_error(&e))?.reply().map_err(|e| x_error(&e))
}

/// A request without a reply, checked: the server did it once this returns.
fn apply(
    what: &'static str,
    request: Result<x11rb::cookie::VoidCookie<'_, RustConnection>, x11rb::errors::ConnectionError>,
) -> Result<(), ScreenError> {
    let x_error = failed(what);
    request.map_err(|e| x_error(&e))?.check().map_err(|e| x_error(&e))
}

/// What a failed RandR request says.
const RANDR: &str = "RandR";

/// Xvfb's screens: 96 dots per inch, as Chromium assumes.
const DOTS_PER_MM: f64 = 96.0 / 25.4;

#[derive(Debug)]
pub struct Screen {
    /// Width in the high half, height in the low half.
    size: AtomicU64,
    /// The framebuffer Xvfb started with: the largest size the screen can take.
    limit: (u32, u32),
    /// `None` for headless browsers, whose "screen" is Chromium's window only.
    display: Option<String>,
    /// Resizes run one at a time.
    resizing: Mutex<()>,
}

impl Screen {
    pub fn new(display: Option<String>, size: (u32, u32), limit: (u32, u32)) -> Self {
        Self { size: AtomicU64::new(pack(size)), limit, display, resizing: Mutex::new(()) }
    }

    /// The largest size the screen can take (its framebuffer's).
    pub fn limit(&self) -> (u32, u32) {
        self.limit
    }

    /// Width and height now.
    pub fn size(&self) -> (u32, u32) {
        let packed = self.size.load(Ordering::Acquire);
        ((packed >> 32) as u32, packed as u32)
    }

    /// Sizes the screen and every top-level window on it to `width` x `height`.
    /// Blocking: a few X round trips.
    pub fn resize(&self, width: u32, height: u32) -> Result<(), ScreenError> {
        let Some(display) = &self.display else {
            return Err(ScreenError::Invalid(
                "this browser is headless: it has no screen to resize".into(),
            ));
        };
        if width == 0 || height == 0 || width > self.limit.0 || height > self.limit.1 {
            return Err(ScreenError::Invalid(format!(
                "{width}x{height} does not fit this browser's largest screen, {}x{}",
                self.limit.0, self.limit.1
            )));
        }
        let _one_at_a_time = self.resizing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (connection, screen) =
            x11rb::connect(Some(display)).map_err(|e| failed("connecting to the display")(&e))?;
        let root = connection.setup().roots[screen].root;
        set_screen_size(&connection, root, width, height)?;
        fill_screen_with_windows(&connection, root, width, height)?;
        self.size.store(pack((width, height)), Ordering::Release);
        Ok(())
    }
}

impl Screen {
    /// Makes Chromium's windows fill the screen exactly, once they are mapped: started
    /// with `--window-size` equal to the screen, Chromium keeps its window a pixel short
    /// of it on each side. Gives up quietly after `patience` without a window.
    pub fn fit_new_windows(&self, patience: std::time::Duration) -> Result<(), ScreenError> {
        let Some(display) = &self.display else {
            return Ok(());
        };
        let (connection, screen) =
            x11rb::connect(Some(display)).map_err(|e| failed("connecting to the display")(&e))?;
        let root = connection.setup().roots[screen].root;
        let deadline = std::time::Instant::now() + patience;
        while std::time::Instant::now() < deadline {
            let sized = {
                let _serialized =
                    self.resizing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let (width, height) = self.size();
                fill_screen_with_windows(&connection, root, width, height)?
            };
            if sized > 0 {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }
}

fn pack((width, height): (u32, u32)) -> u64 {
    (u64::from(width) << 32) | u64::from(height)
}

/// The RandR sequence `xrandr --newmode/--addmode/--output --mode --fb` performs: a mode
/// of the new size on the screen's one output, the CRTC switched off while the screen
/// changes size (a CRTC may never be larger than its screen), then on with that mode.
fn set_screen_size(
    connection: &RustConnection, root: Window, width: u32, height: u32,
) -> Result<(), ScreenError> {
    let (Ok(width16), Ok(height16)) = (u16::try_from(width), u16::try_from(height)) else {
        return Err(ScreenError::Invalid(format!("{width}x{height} is too large")));
    };
    connection
        .extension_information(randr::X11_EXTENSION_NAME)
        .map_err(|e| failed(RANDR)(&e))?
        .ok_or_else(|| ScreenError::Failed("the X server has no RandR".into()))?;
    // The server speaks the version the client announces.
    ask(RANDR, connection.randr_query_version(1, 5))?;
    let resources = ask(RANDR, connection.randr_get_screen_resources(root))?;
    let (Some(&output), Some(&crtc)) = (resources.outputs.first(), resources.crtcs.first()) else {
        return Err(ScreenError::Failed("the screen has no RandR output".into()));
    };
    let mode = match resources
        .modes
        .iter()
        .find(|mode| mode.width == width16 && mode.height == height16)
    {
        Some(mode) => mode.id,
        None => {
            let name = format!("{width}x{height}");
            let info = ModeInfo {
                width: width16,
                height: height16,
                htotal: width16,
                vtotal: height16,
                name_len: name.len() as u16,
                ..ModeInfo::default()
            };
            ask(RANDR, connection.randr_create_mode(root, info, name.as_bytes()))?.mode
        }
    };
    let output_info =
        ask(RANDR, connection.randr_get_output_info(output, resources.config_timestamp))?;
    if !output_info.modes.contains(&mode) {
        apply(RANDR, connection.randr_add_output_mode(output, mode))?;
    }
    let set_crtc = |mode: randr::Mode, outputs: &[randr::Output]| -> Result<(), ScreenError> {
        // Adding a mode moves the configuration's timestamp on: ask for the current one.
        let timestamp =
            ask(RANDR, connection.randr_get_screen_resources_current(root))?.config_timestamp;
        let reply = ask(
            RANDR,
            connection.randr_set_crtc_config(
                crtc,
                x11rb::CURRENT_TIME,
                timestamp,
                0,
                0,
                mode,
                randr::Rotation::ROTATE0,
                outputs,
            ),
        )?;
        if reply.status != randr::SetConfig::SUCCESS {
            return Err(ScreenError::Failed(format!(
                "the X server refused the CRTC configuration ({:?})",
                reply.status
            )));
        }
        Ok(())
    };
    set_crtc(x11rb::NONE, &[])?;
    let (width_mm, height_mm) = (f64::from(width) / DOTS_PER_MM, f64::from(height) / DOTS_PER_MM);
    apply(
        RANDR,
        connection.randr_set_screen_size(
            root,
            width16,
            height16,
            width_mm.round() as u32,
            height_mm.round() as u32,
        ),
    )?;
    set_crtc(mode, &[output])
}

/// Does what a window manager would for maximized windows: every mapped top-level window
/// (Chromium's browser windows; menus and popups are override-redirect and left alone)
/// is placed at the origin with the screen's size. Chromium keeps kiosk mode through it.
/// Answers how many windows it sized.
fn fill_screen_with_windows(
    connection: &RustConnection, root: Window, width: u32, height: u32,
) -> Result<usize, ScreenError> {
    const WHAT: &str = "sizing Chromium's windows";
    let x_error = failed(WHAT);
    let children = ask(WHAT, connection.query_tree(root))?.children;
    let size = ConfigureWindowAux::new().x(0).y(0).width(width).height(height);
    let mut sized = 0;
    for window in children {
        // A window may be gone by now: skip it.
        let Ok(attributes) =
            connection.get_window_attributes(window).map_err(|e| x_error(&e))?.reply()
        else {
            continue;
        };
        if attributes.map_state == MapState::VIEWABLE && !attributes.override_redirect {
            connection.configure_window(window, &size).map_err(|e| x_error(&e))?;
            sized += 1;
        }
    }
    // A round trip: the windows have their new size once the call answers.
    connection.sync().map_err(|e| x_error(&e))?;
    Ok(sized)
}
