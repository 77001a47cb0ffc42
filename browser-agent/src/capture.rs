//! Screenshots of the X display: one GetImage of the root window, encoded as PNG.
//! Blocking; run on a blocking thread.
//!
//! Plain X11 through x11rb, which the agent speaks anyway: a screenshot library would
//! bring its Wayland, PipeWire and D-Bus code along (about 90 crates, and libclang to
//! build them) for this one request.

use x11rb::connection::Connection;
use x11rb::protocol::xproto::{ConnectionExt as _, ImageFormat, ImageOrder};

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{0}")]
    Invalid(String),
    #[error("capturing the screen failed: {0}")]
    Failed(String),
}

/// A region of the screen: x, y, width, height.
pub type Region = (u32, u32, u32, u32);

/// PNG of the whole screen of `display` (`screen` is its size) or of `region`.
pub fn screenshot(
    display: &str, region: Option<Region>, screen: (u32, u32),
) -> Result<Vec<u8>, CaptureError> {
    let (x, y, width, height) = region.unwrap_or((0, 0, screen.0, screen.1));
    if width == 0
        || height == 0
        || x.saturating_add(width) > screen.0
        || y.saturating_add(height) > screen.1
    {
        return Err(CaptureError::Invalid(format!(
            "region {width}x{height}+{x}+{y} is empty or outside the {}x{} screen",
            screen.0, screen.1
        )));
    }
    let rgb = capture_rgb(display, (x, y, width, height))?;
    let mut png = Vec::new();
    let mut encoder = png::Encoder::new(&mut png, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // The encoder's balance of size and speed (what the `image` crate uses too).
    encoder.set_compression(png::Compression::Balanced);
    let encoding_failed = |error: png::EncodingError| CaptureError::Failed(error.to_string());
    let mut writer = encoder.write_header().map_err(encoding_failed)?;
    writer.write_image_data(&rgb).map_err(encoding_failed)?;
    writer.finish().map_err(encoding_failed)?;
    Ok(png)
}

fn failed(what: &str) -> impl Fn(&dyn std::fmt::Display) -> CaptureError + '_ {
    move |error| CaptureError::Failed(format!("{what}: {error}"))
}

/// The region's pixels, 3 bytes each (red, green, blue), row after row.
fn capture_rgb(display: &str, (x, y, width, height): Region) -> Result<Vec<u8>, CaptureError> {
    let (connection, screen) =
        x11rb::connect(Some(display)).map_err(|e| failed("connecting to the X display")(&e))?;
    let setup = connection.setup();
    let root = &setup.roots[screen];
    // Depth 24 at 32 bits per pixel, as Xvfb is started: each pixel is one 32-bit word,
    // 0x00RRGGBB, in the server's byte order. Rows have no padding at that size.
    if root.root_depth != 24
        || !setup.pixmap_formats.iter().any(|f| f.depth == 24 && f.bits_per_pixel == 32)
    {
        return Err(CaptureError::Failed(format!(
            "the display has depth {}; screenshots need depth 24 at 32 bits per pixel",
            root.root_depth
        )));
    }
    let coordinates =
        (i16::try_from(x), i16::try_from(y), u16::try_from(width), u16::try_from(height));
    let (Ok(x), Ok(y), Ok(width), Ok(height)) = coordinates else {
        return Err(CaptureError::Invalid("the region is larger than X11 can address".into()));
    };
    let image = connection
        .get_image(ImageFormat::Z_PIXMAP, root.root, x, y, width, height, !0)
        .map_err(|e| failed("asking for the image")(&e))?
        .reply()
        .map_err(|e| failed("reading the image")(&e))?;
    let pixels = usize::from(width) * usize::from(height);
    if image.data.len() != pixels * 4 {
        return Err(CaptureError::Failed(format!(
            "the display sent {} bytes for {pixels} pixels",
            image.data.len()
        )));
    }
    // Where red, green and blue are in each 4-byte pixel.
    let [r, g, b] =
        if setup.image_byte_order == ImageOrder::LSB_FIRST { [2, 1, 0] } else { [1, 2, 3] };
    let mut rgb = Vec::with_capacity(pixels * 3);
    for pixel in image.data.chunks_exact(4) {
        rgb.extend_from_slice(&[pixel[r], pixel[g], pixel[b]]);
    }
    Ok(rgb)
}
