//! The VM display's clipboard and pointer visibility (`computer/clipboard/*`,
//! `computer/cursor`). The clipboard is arboard's, which serves what we write for as long
//! as the agent lives (X selections belong to a live client). Hiding the pointer is
//! XFixes' HideCursor, which lasts while the connection that asked stays open, so one is
//! kept; recordings stop drawing the pointer in while it is hidden.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use x11rb::connection::Connection;
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;

/// Whether the pointer is hidden on this agent's display (one display per agent).
static CURSOR_HIDDEN: AtomicBool = AtomicBool::new(false);

pub fn cursor_hidden() -> bool {
    CURSOR_HIDDEN.load(Ordering::Relaxed)
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DesktopError(String);

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> DesktopError + '_ {
    move |error| DesktopError(format!("{what}: {error}"))
}

/// Both made on first use, on `$DISPLAY` (the agent exports it at start).
#[derive(Default)]
pub struct Desktop {
    clipboard: Mutex<Option<arboard::Clipboard>>,
    cursor: Mutex<Option<(RustConnection, u32)>>,
}

impl Desktop {
    /// The clipboard's text; empty when it holds none.
    pub fn read_clipboard(&self) -> Result<String, DesktopError> {
        self.with_clipboard(|clipboard| match clipboard.get_text() {
            Ok(text) => Ok(text),
            Err(arboard::Error::ContentNotAvailable) => Ok(String::new()),
            Err(error) => Err(failed("reading the clipboard")(&error)),
        })
    }

    pub fn write_clipboard(&self, text: &str) -> Result<(), DesktopError> {
        self.with_clipboard(|clipboard| {
            clipboard.set_text(text).map_err(|error| failed("writing the clipboard")(&error))
        })
    }

    fn with_clipboard<T>(
        &self, work: impl FnOnce(&mut arboard::Clipboard) -> Result<T, DesktopError>,
    ) -> Result<T, DesktopError> {
        let mut held = self
            .clipboard
            .lock()
            .map_err(|_| DesktopError("the clipboard lock is poisoned".into()))?;
        if held.is_none() {
            *held = Some(
                arboard::Clipboard::new()
                    .map_err(|error| failed("opening the clipboard")(&error))?,
            );
        }
        match held.as_mut() {
            Some(clipboard) => work(clipboard),
            None => Err(DesktopError("no clipboard".into())),
        }
    }

    /// Hides or shows the pointer on the display (and in recordings).
    pub fn set_cursor_hidden(&self, hidden: bool) -> Result<(), DesktopError> {
        let mut held =
            self.cursor.lock().map_err(|_| DesktopError("the cursor lock is poisoned".into()))?;
        if held.is_none() {
            let (connection, screen) =
                x11rb::connect(None).map_err(|e| failed("connecting to the display")(&e))?;
            let root = connection.setup().roots[screen].root;
            // XFixes needs its version asked before any other request.
            connection
                .xfixes_query_version(5, 0)
                .map_err(|e| failed("asking for XFixes")(&e))?
                .reply()
                .map_err(|e| failed("asking for XFixes")(&e))?;
            *held = Some((connection, root));
        }
        let Some((connection, root)) = held.as_ref() else {
            return Err(DesktopError("no display connection".into()));
        };
        // HideCursor and ShowCursor nest per client: only change on a real change.
        if hidden != cursor_hidden() {
            let request = if hidden {
                connection.xfixes_hide_cursor(*root)
            } else {
                connection.xfixes_show_cursor(*root)
            };
            request
                .map_err(|e| failed("changing the cursor")(&e))?
                .check()
                .map_err(|e| failed("changing the cursor")(&e))?;
            CURSOR_HIDDEN.store(hidden, Ordering::Relaxed);
        }
        Ok(())
    }
}
