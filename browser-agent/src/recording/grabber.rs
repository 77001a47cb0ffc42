//! Frames of the X display for video: one persistent X connection, MIT-SHM so the server
//! writes each area straight into memory we share with it (~2 ms per 1920x1080 frame,
//! where a fresh connection per frame cost ~15 ms), only the areas DAMAGE says were drawn
//! on, and the cursor drawn in from XFixes (the X server leaves it out of images; viewers
//! expect to see it).

use std::ptr::NonNull;

use x11rb::connection::Connection;
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xfixes::{ConnectionExt as _, GetCursorImageReply};
use x11rb::protocol::xproto::{ConnectionExt as _, ImageFormat, Window};
use x11rb::rust_connection::RustConnection;

use super::canvas::Canvas;
pub(crate) use crate::damage::GrabResult;
use crate::damage::{DamageMonitor, Rect, clip};

/// Bytes per pixel of the frames: depth-24 ZPixmap images are 32 bits per pixel, in
/// memory B, G, R, unused (ffmpeg's `bgr0`).
pub const BYTES_PER_PIXEL: usize = 4;

pub struct Grabber {
    connection: RustConnection,
    root: Window,
    size: (u16, u16),
    /// `None` when the server has no MIT-SHM (then frames travel over the socket).
    shared: Option<(u32, SharedSegment)>,
    /// Frame storage without MIT-SHM.
    copied: Vec<u8>,
    has_xfixes: bool,
    /// `None` when the server has no DAMAGE: then every update reads the whole screen.
    damage: Option<DamageMonitor>,
    /// Where the cursor drawn into the picture is, and which image it was.
    drawn_cursor: Option<CursorPlace>,
}

/// A cursor's place on the screen and its image (by serial).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CursorPlace {
    left: i32,
    top: i32,
    width: u16,
    height: u16,
    serial: u32,
}

impl CursorPlace {
    fn of(cursor: &GetCursorImageReply) -> Self {
        Self {
            left: i32::from(cursor.x) - i32::from(cursor.xhot),
            top: i32::from(cursor.y) - i32::from(cursor.yhot),
            width: cursor.width,
            height: cursor.height,
            serial: cursor.cursor_serial,
        }
    }

    fn area(&self, size: (u16, u16)) -> Option<Rect> {
        clip((self.left, self.top, i32::from(self.width), i32::from(self.height)), size)
    }
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |error| format!("{what}: {error}")
}

impl Grabber {
    pub fn connect(display: &str, width: u32, height: u32) -> GrabResult<Self> {
        let (connection, screen) =
            x11rb::connect(Some(display)).map_err(|e| failed("connecting to the X display")(&e))?;
        let screen = &connection.setup().roots[screen];
        let root = screen.root;
        if screen.root_depth != 24
            || !connection
                .setup()
                .pixmap_formats
                .iter()
                .any(|f| f.depth == 24 && f.bits_per_pixel == 32)
        {
            return Err(format!(
                "the display has depth {}; recording needs depth 24 at 32 bits per pixel",
                screen.root_depth
            ));
        }
        let size = (
            u16::try_from(width).map_err(|_| "screen too wide".to_owned())?,
            u16::try_from(height).map_err(|_| "screen too high".to_owned())?,
        );
        let has_xfixes = connection
            .xfixes_query_version(4, 0)
            .ok()
            .and_then(|cookie| cookie.reply().ok())
            .is_some();
        let frame_bytes = usize::from(size.0) * usize::from(size.1) * BYTES_PER_PIXEL;
        let shared = match attach_shared_segment(&connection, frame_bytes) {
            Ok(shared) => Some(shared),
            Err(error) => {
                tracing::warn!(%error, "MIT-SHM unavailable; frames will be copied over the X socket");
                None
            }
        };
        let damage = match DamageMonitor::create(&connection, root) {
            Ok(damage) => Some(damage),
            Err(error) => {
                tracing::warn!(%error, "DAMAGE unavailable; every frame reads the whole screen");
                None
            }
        };
        Ok(Self {
            connection,
            root,
            size,
            shared,
            copied: Vec::new(),
            has_xfixes,
            damage,
            drawn_cursor: None,
        })
    }

    pub fn size(&self) -> (u16, u16) {
        self.size
    }

    /// Brings `canvas` up to date with the screen, the cursor drawn in (unless it is
    /// hidden): reads what was drawn on since the last update, and the cursor's old and
    /// new places if it moved or changed. Answers whether the picture changed.
    pub fn update(&mut self, canvas: &mut Canvas) -> GrabResult<bool> {
        let cursor = self.cursor();
        let place = cursor.as_ref().map(CursorPlace::of);
        let whole = Rect::whole(self.size);
        let mut areas = Vec::with_capacity(3);
        match &mut self.damage {
            // The first take is the whole screen.
            Some(damage) => {
                if damage.poll(&self.connection)?
                    && let Some(drawn) = damage.take(&self.connection, self.size)?
                {
                    areas.push(drawn);
                }
            }
            None => areas.push(whole),
        }
        if place != self.drawn_cursor && !areas.contains(&whole) {
            // The old place shows the screen again; the new one gets the cursor.
            areas.extend(self.drawn_cursor.and_then(|old| old.area(self.size)));
            areas.extend(place.and_then(|new| new.area(self.size)));
        }
        let mut painted = false;
        for area in &areas {
            let Some(area) = canvas.aligned(*area) else {
                continue;
            };
            let pixels = read_area(
                &self.connection,
                self.root,
                &mut self.shared,
                &mut self.copied,
                (area.x as i16, area.y as i16, area.width, area.height),
            )?;
            let bytes = usize::from(area.width) * usize::from(area.height) * BYTES_PER_PIXEL;
            let pixels =
                pixels.get_mut(..bytes).ok_or_else(|| "the captured area is short".to_owned())?;
            if let Some(cursor) = &cursor {
                draw_cursor(pixels, area, cursor);
            }
            canvas.paint(area, pixels)?;
            painted = true;
        }
        self.drawn_cursor = place;
        Ok(painted)
    }

    /// The cursor's image and place, unless it is hidden (`computer/cursor`) or the
    /// server cannot tell.
    fn cursor(&self) -> Option<GetCursorImageReply> {
        if !self.has_xfixes || crate::desktop::cursor_hidden() {
            return None;
        }
        self.connection.xfixes_get_cursor_image().ok()?.reply().ok()
    }
}

/// Reads an area (x, y, width, height) of the root window as depth-24 ZPixmap rows: the
/// X server writes it into the shared segment (MIT-SHM, sized for the whole screen)
/// when there is one, else it comes over the socket into `copied`. Valid until the next
/// read.
pub(crate) fn read_area<'a>(
    connection: &RustConnection, root: Window, shared: &'a mut Option<(u32, SharedSegment)>,
    copied: &'a mut Vec<u8>, (x, y, width, height): (i16, i16, u16, u16),
) -> GrabResult<&'a mut [u8]> {
    match shared {
        Some((segment_id, segment)) => {
            connection
                .shm_get_image(
                    root,
                    x,
                    y,
                    width,
                    height,
                    !0,
                    ImageFormat::Z_PIXMAP.into(),
                    *segment_id,
                    0,
                )
                .map_err(|e| failed("requesting a frame")(&e))?
                .reply()
                .map_err(|e| failed("capturing a frame")(&e))?;
            Ok(segment.bytes_mut())
        }
        None => {
            *copied = connection
                .get_image(ImageFormat::Z_PIXMAP, root, x, y, width, height, !0)
                .map_err(|e| failed("requesting a frame")(&e))?
                .reply()
                .map_err(|e| failed("capturing a frame")(&e))?
                .data;
            Ok(copied)
        }
    }
}

/// Blends the cursor (premultiplied ARGB) at its hotspot-adjusted position over `pixels`,
/// the screen's `area` as rows of `area.width` pixels.
fn draw_cursor(pixels: &mut [u8], area: Rect, cursor: &GetCursorImageReply) {
    let (width, height) = (i64::from(area.width), i64::from(area.height));
    let left = i64::from(cursor.x) - i64::from(cursor.xhot) - i64::from(area.x);
    let top = i64::from(cursor.y) - i64::from(cursor.yhot) - i64::from(area.y);
    let cursor_width = usize::from(cursor.width);
    for (row, cursor_row) in cursor.cursor_image.chunks(cursor_width.max(1)).enumerate() {
        let y = top + row as i64;
        if y < 0 || y >= height {
            continue;
        }
        for (column, &argb) in cursor_row.iter().enumerate() {
            let x = left + column as i64;
            let alpha = argb >> 24;
            if x < 0 || x >= width || alpha == 0 {
                continue;
            }
            let offset = (y * width + x) as usize * BYTES_PER_PIXEL;
            let Some(pixel) = pixels.get_mut(offset..offset + 3) else {
                continue;
            };
            // Memory order B, G, R; the source is premultiplied, so dst = src + dst·(1−α).
            for (channel, shift) in pixel.iter_mut().zip([0u32, 8, 16]) {
                let source = (argb >> shift) & 0xff;
                let kept = u32::from(*channel) * (255 - alpha) / 255;
                *channel = (source + kept).min(255) as u8;
            }
        }
    }
}

/// Creates a System V shared memory segment, has the X server attach it, and marks it for
/// removal at once: the kernel frees it when both sides have detached, also if we crash.
pub(crate) fn attach_shared_segment(
    connection: &RustConnection, bytes: usize,
) -> GrabResult<(u32, SharedSegment)> {
    connection
        .shm_query_version()
        .map_err(|e| failed("MIT-SHM")(&e))?
        .reply()
        .map_err(|e| failed("MIT-SHM")(&e))?;
    let segment = SharedSegment::create(bytes).map_err(|e| failed("shared memory")(&e))?;
    let segment_id = connection.generate_id().map_err(|e| failed("X resource id")(&e))?;
    connection
        .shm_attach(segment_id, segment.id as u32, false)
        .map_err(|e| failed("MIT-SHM attach")(&e))?
        .check()
        .map_err(|e| failed("MIT-SHM attach")(&e))?;
    segment.mark_for_removal();
    Ok((segment_id, segment))
}

/// A System V shared memory segment mapped into this process.
pub(crate) struct SharedSegment {
    id: libc::c_int,
    address: NonNull<u8>,
    bytes: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&mut self`.
unsafe impl Send for SharedSegment {}

impl SharedSegment {
    fn create(bytes: usize) -> std::io::Result<Self> {
        // SAFETY: plain System V calls; every failure is checked and undone.
        unsafe {
            let id = libc::shmget(libc::IPC_PRIVATE, bytes, libc::IPC_CREAT | 0o600);
            if id < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let address = libc::shmat(id, std::ptr::null(), 0);
            if address as isize == -1 {
                let error = std::io::Error::last_os_error();
                libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut());
                return Err(error);
            }
            let address = NonNull::new(address.cast::<u8>())
                .ok_or_else(|| std::io::Error::other("shmat returned null"))?;
            Ok(Self { id, address, bytes })
        }
    }

    fn mark_for_removal(&self) {
        // SAFETY: removal only takes effect once every attachment is gone.
        unsafe {
            libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `bytes` long and lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.address.as_ptr(), self.bytes) }
    }
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        // SAFETY: detaching our own mapping; the id may already be marked for removal.
        unsafe {
            libc::shmdt(self.address.as_ptr().cast());
            libc::shmctl(self.id, libc::IPC_RMID, std::ptr::null_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cursor `size` pixels square at `(x, y)`, its hotspot at `(hot, hot)`.
    fn square_cursor(
        (x, y): (i16, i16), size: u16, hot: u16, image: Vec<u32>,
    ) -> x11rb::protocol::xfixes::GetCursorImageReply {
        x11rb::protocol::xfixes::GetCursorImageReply {
            sequence: 0,
            length: 0,
            x,
            y,
            width: size,
            height: size,
            xhot: hot,
            yhot: hot,
            cursor_serial: 0,
            cursor_image: image,
        }
    }

    #[test]
    fn the_cursor_is_blended_over_the_frame_and_clipped_at_its_edges() {
        let (width, height) = (4, 3);
        let screen = Rect::whole((4, 3));
        let blank = || vec![100u8; width * height * BYTES_PER_PIXEL];
        let mut frame = blank();
        // 2x2 cursor with its hotspot at (1,1), pointing at (0,0): only its bottom-right
        // pixel is on screen. Opaque red there; fully transparent elsewhere.
        let cursor = square_cursor((0, 0), 2, 1, vec![0xffff_ffff, 0, 0, 0xff_ff_00_00]);
        draw_cursor(&mut frame, screen, &cursor);
        assert_eq!(&frame[0..4], &[0, 0, 255, 100], "B, G, R of the red pixel");
        assert!(frame[4..].iter().all(|&b| b == 100), "the rest is untouched");

        // Half-transparent white (premultiplied 0x80) over 100 gives 128 + 100·127/255.
        let mut frame = blank();
        let cursor = square_cursor((3, 2), 1, 0, vec![0x80_80_80_80]);
        draw_cursor(&mut frame, screen, &cursor);
        let last = (2 * width + 3) * BYTES_PER_PIXEL;
        assert_eq!(&frame[last..last + 3], &[177, 177, 177]);

        // Over an area of the screen: the cursor at (3, 2) is the area's pixel (1, 0).
        let area = Rect { x: 2, y: 2, width: 2, height: 1 };
        let mut pixels = vec![100u8; 2 * BYTES_PER_PIXEL];
        draw_cursor(&mut pixels, area, &cursor);
        assert_eq!(&pixels[..4], &[100; 4], "left of the cursor");
        assert_eq!(&pixels[4..7], &[177, 177, 177]);
    }
}
