//! What the live view sends: the parts of the screen that changed, as the X server's
//! DAMAGE extension reports them, read through MIT-SHM and compressed with libjpeg-turbo.
//! An unchanged screen costs one non-blocking read of the X socket per tick: nothing is
//! captured or encoded until something is drawn.

use x11rb::connection::Connection;
use x11rb::protocol::shm::ConnectionExt as _;
use x11rb::protocol::xproto::{ConnectionExt as _, Window};
use x11rb::rust_connection::RustConnection;

use crate::damage::DamageMonitor;
pub use crate::damage::Rect;
use crate::recording::grabber::{GrabResult, SharedSegment, attach_shared_segment, read_area};

/// JPEG quality of the tiles: text stays crisp enough to read, a full 1080p frame of a
/// typical page is ~150 KiB.
const JPEG_QUALITY: i32 = 75;
/// A damaged area this many rows high or more is cut into horizontal bands, encoded on
/// threads of their own and decoded in parallel by the viewer: a full 1080p frame then
/// reaches the screen in a fraction of the time one JPEG takes.
const BAND_ROWS: u16 = 256;
const MAX_BANDS: usize = 4;

pub struct DamageCapture {
    connection: RustConnection,
    root: Window,
    damage: DamageMonitor,
    size: (u16, u16),
    /// Sized for the whole screen; `None` without MIT-SHM (frames come over the socket).
    shared: Option<(u32, SharedSegment)>,
    copied: Vec<u8>,
    /// One per band.
    compressors: Vec<turbojpeg::Compressor>,
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> String + '_ {
    move |error| format!("{what}: {error}")
}

impl DamageCapture {
    pub fn connect(display: &str, (width, height): (u32, u32)) -> GrabResult<Self> {
        let (connection, screen) =
            x11rb::connect(Some(display)).map_err(|e| failed("connecting to the X display")(&e))?;
        let root = connection.setup().roots[screen].root;
        let damage = DamageMonitor::create(&connection, root)?;
        let compressors = (0..MAX_BANDS)
            .map(|_| {
                let mut compressor =
                    turbojpeg::Compressor::new().map_err(|e| failed("libjpeg-turbo")(&e))?;
                compressor.set_quality(JPEG_QUALITY);
                compressor.set_subsamp(turbojpeg::Subsamp::Sub2x2);
                Ok(compressor)
            })
            .collect::<GrabResult<Vec<_>>>()?;
        let mut capture = Self {
            connection,
            root,
            damage,
            size: (0, 0),
            shared: None,
            copied: Vec::new(),
            compressors,
        };
        capture.resize((width, height))?;
        Ok(capture)
    }

    /// Whether damage arrived that has not been taken yet.
    pub fn pending(&self) -> bool {
        self.damage.pending()
    }

    pub fn size(&self) -> (u16, u16) {
        self.size
    }

    /// Follows a new screen size (a viewport change).
    pub fn resize(&mut self, (width, height): (u32, u32)) -> GrabResult<()> {
        let size = (
            u16::try_from(width).map_err(|_| "screen too wide".to_owned())?,
            u16::try_from(height).map_err(|_| "screen too high".to_owned())?,
        );
        if size == self.size {
            return Ok(());
        }
        let bytes = usize::from(size.0) * usize::from(size.1) * 4;
        // Detach the old segment first: the X server keeps its own mapping otherwise.
        if let Some((segment_id, _)) = self.shared.take() {
            let _ = self.connection.shm_detach(segment_id);
        }
        self.shared = match attach_shared_segment(&self.connection, bytes) {
            Ok(shared) => Some(shared),
            Err(error) => {
                tracing::warn!(%error, "MIT-SHM unavailable; the live view copies frames over the X socket");
                None
            }
        };
        self.size = size;
        Ok(())
    }

    /// Waits up to `timeout` for damage, unless some is pending already (also among the
    /// events read along with earlier replies).
    pub fn wait(&mut self, timeout: std::time::Duration) -> GrabResult<()> {
        use std::os::fd::AsFd;
        if self.poll()? {
            return Ok(());
        }
        let descriptor = self.connection.stream().as_fd();
        let mut wanted = [nix::poll::PollFd::new(descriptor, nix::poll::PollFlags::POLLIN)];
        let millis = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        let _ = nix::poll::poll(&mut wanted, nix::poll::PollTimeout::from(millis));
        Ok(())
    }

    /// Reads the events that have arrived; answers whether anything was drawn since the
    /// damage was last taken.
    pub fn poll(&mut self) -> GrabResult<bool> {
        self.damage.poll(&self.connection)
    }

    /// The extent of what was drawn since the last call (the whole screen the first
    /// time), and re-arms the monitor.
    pub fn take_damage(&mut self) -> GrabResult<Option<Rect>> {
        self.damage.take(&self.connection, self.size)
    }

    pub fn whole_screen(&self) -> Rect {
        Rect::whole(self.size)
    }

    /// The rectangle as JPEG tiles: one per band, top to bottom.
    pub fn encode(&mut self, rect: Rect) -> GrabResult<Vec<(Rect, Vec<u8>)>> {
        let pixels = read_area(
            &self.connection,
            self.root,
            &mut self.shared,
            &mut self.copied,
            (rect.x as i16, rect.y as i16, rect.width, rect.height),
        )?;
        let pitch = usize::from(rect.width) * 4;
        let pixels = pixels
            .get(..pitch * usize::from(rect.height))
            .ok_or_else(|| "the captured frame is short".to_owned())?;
        let bands = bands(rect);
        if let ([band], [compressor, ..]) = (bands.as_slice(), self.compressors.as_mut_slice()) {
            return Ok(vec![(*band, compress(compressor, pixels, *band, pitch)?)]);
        }
        std::thread::scope(|scope| {
            let workers: Vec<_> = bands
                .iter()
                .zip(self.compressors.iter_mut())
                .map(|(band, compressor)| {
                    let rows = &pixels[usize::from(band.y - rect.y) * pitch..]
                        [..usize::from(band.height) * pitch];
                    std::thread::Builder::new()
                        .name("live-view-band".into())
                        .spawn_scoped(scope, move || compress(compressor, rows, *band, pitch))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(|error| format!("starting a tile encoder: {error}"))?;
            bands
                .iter()
                .zip(workers)
                .map(|(band, worker)| {
                    let jpeg = worker.join().map_err(|_| "a tile encoder failed".to_owned())??;
                    Ok((*band, jpeg))
                })
                .collect()
        })
    }

    /// Where the pointer is.
    pub fn pointer(&self) -> GrabResult<(i32, i32)> {
        let reply = self
            .connection
            .query_pointer(self.root)
            .map_err(|e| failed("reading the pointer")(&e))?
            .reply()
            .map_err(|e| failed("reading the pointer")(&e))?;
        Ok((i32::from(reply.root_x), i32::from(reply.root_y)))
    }
}

/// `pixels` (rows of `pitch` bytes, BGRX) of `band` as a JPEG.
fn compress(
    compressor: &mut turbojpeg::Compressor, pixels: &[u8], band: Rect, pitch: usize,
) -> GrabResult<Vec<u8>> {
    let image = turbojpeg::Image {
        pixels,
        width: usize::from(band.width),
        pitch,
        height: usize::from(band.height),
        format: turbojpeg::PixelFormat::BGRX,
    };
    compressor.compress_to_vec(image).map_err(|e| failed("encoding a tile")(&e))
}

/// `rect` cut into up to [`MAX_BANDS`] horizontal bands of at least [`BAND_ROWS`] rows
/// (the last takes the remainder), top to bottom.
fn bands(rect: Rect) -> Vec<Rect> {
    let count = usize::from(rect.height / BAND_ROWS).clamp(1, MAX_BANDS) as u16;
    let rows = rect.height / count;
    (0..count)
        .map(|index| Rect {
            y: rect.y + index * rows,
            height: if index + 1 == count { rect.height - index * rows } else { rows },
            ..rect
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tall_areas_are_cut_into_bands_that_cover_them_exactly() {
        let rect = Rect { x: 10, y: 20, width: 1920, height: 1080 };
        let cut = bands(rect);
        assert_eq!(cut.len(), 4);
        assert_eq!(cut[0].y, 20);
        assert_eq!(cut.iter().map(|band| band.height).sum::<u16>(), 1080);
        for pair in cut.windows(2) {
            assert_eq!(pair[0].y + pair[0].height, pair[1].y, "no gap, no overlap");
        }
        let small = Rect { height: 300, ..rect };
        assert_eq!(bands(small), vec![small]);
    }
}
