//! Which part of the screen was drawn on, from the X server's DAMAGE extension: the first
//! drawing after each look arrives as an event, and the area drawn since is read by
//! moving the damage into an XFixes region. An unchanged screen costs one non-blocking
//! read of the X socket. The live view and the recorder both capture only what this says
//! changed.

use x11rb::connection::Connection;
use x11rb::protocol::Event;
use x11rb::protocol::damage::{ConnectionExt as _, ReportLevel};
use x11rb::protocol::xfixes::ConnectionExt as _;
use x11rb::protocol::xproto::Window;
use x11rb::rust_connection::RustConnection;

/// What an X11 request of the recorder gives: its answer, or why it failed.
pub(crate) type GrabResult<T> = Result<T, String>;

/// A rectangle of the screen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rect {
    pub x: u16,
    pub y: u16,
    pub width: u16,
    pub height: u16,
}

impl Rect {
    pub fn whole(size: (u16, u16)) -> Self {
        Self { x: 0, y: 0, width: size.0, height: size.1 }
    }
}

/// Follows the drawing on one connection's root window.
pub struct DamageMonitor {
    damage: u32,
    /// XFixes region the damage is moved into, to read its extent.
    region: u32,
    /// Something was drawn since the damage was last taken (or nothing was taken yet).
    pending: bool,
    /// Nothing was taken yet: drawing before the monitor existed is not in its damage.
    fresh: bool,
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |error| format!("{what}: {error}")
}

impl DamageMonitor {
    /// Starts following `root`. Its first [`take`](Self::take) is the whole screen, since
    /// drawing before this call is not reported.
    pub fn create(connection: &RustConnection, root: Window) -> GrabResult<Self> {
        connection
            .xfixes_query_version(4, 0)
            .map_err(|e| failed("XFixes")(&e))?
            .reply()
            .map_err(|e| failed("XFixes")(&e))?;
        connection
            .damage_query_version(1, 1)
            .map_err(|e| failed("DAMAGE")(&e))?
            .reply()
            .map_err(|e| failed("DAMAGE")(&e))?;
        let damage = connection.generate_id().map_err(|e| failed("X resource id")(&e))?;
        connection
            .damage_create(damage, root, ReportLevel::NON_EMPTY)
            .map_err(|e| failed("creating the damage monitor")(&e))?;
        let region = connection.generate_id().map_err(|e| failed("X resource id")(&e))?;
        connection
            .xfixes_create_region(region, &[])
            .map_err(|e| failed("creating a region")(&e))?;
        Ok(Self { damage, region, pending: true, fresh: true })
    }

    /// Whether damage arrived that has not been taken yet (as of the last `poll`).
    pub fn pending(&self) -> bool {
        self.pending
    }

    /// Reads the events that have arrived (also those read along with earlier replies);
    /// answers whether anything was drawn since the damage was last taken.
    pub fn poll(&mut self, connection: &RustConnection) -> GrabResult<bool> {
        while let Some(event) =
            connection.poll_for_event().map_err(|e| failed("reading X events")(&e))?
        {
            if let Event::DamageNotify(_) = event {
                self.pending = true;
            }
        }
        Ok(self.pending)
    }

    /// The extent of what was drawn since the last call (the whole screen the first
    /// time), within a screen of `size`, and re-arms the monitor (the next drawing sends a
    /// new event).
    pub fn take(
        &mut self, connection: &RustConnection, size: (u16, u16),
    ) -> GrabResult<Option<Rect>> {
        self.pending = false;
        connection
            .damage_subtract(self.damage, x11rb::NONE, self.region)
            .map_err(|e| failed("reading the damage")(&e))?;
        let extents = connection
            .xfixes_fetch_region(self.region)
            .map_err(|e| failed("reading the damage")(&e))?
            .reply()
            .map_err(|e| failed("reading the damage")(&e))?
            .extents;
        if std::mem::take(&mut self.fresh) {
            let (width, height) = (i32::from(size.0), i32::from(size.1));
            return Ok(clip((0, 0, width, height), size));
        }
        Ok(clip(
            (
                i32::from(extents.x),
                i32::from(extents.y),
                i32::from(extents.width),
                i32::from(extents.height),
            ),
            size,
        ))
    }
}

/// `(x, y, width, height)` clipped to a screen of `size`; `None` when nothing is left.
pub fn clip((x, y, width, height): (i32, i32, i32, i32), size: (u16, u16)) -> Option<Rect> {
    let left = x.max(0);
    let top = y.max(0);
    let right = (x + width).min(i32::from(size.0));
    let bottom = (y + height).min(i32::from(size.1));
    (right > left && bottom > top).then(|| Rect {
        x: left as u16,
        y: top as u16,
        width: (right - left) as u16,
        height: (bottom - top) as u16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damage_is_clipped_to_the_screen() {
        let screen = (100, 50);
        assert_eq!(
            clip((-10, 40, 30, 30), screen),
            Some(Rect { x: 0, y: 40, width: 20, height: 10 })
        );
        assert_eq!(clip((100, 0, 10, 10), screen), None);
        assert_eq!(clip((5, 5, 0, 10), screen), None);
    }
}
