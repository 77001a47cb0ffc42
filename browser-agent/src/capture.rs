//! Screenshots of the X display with xcap. Blocking; run on a blocking thread.

use std::io::Cursor;

use xcap::Monitor;
use xcap::image::{ImageFormat, RgbaImage};

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{0}")]
    Invalid(String),
    #[error("capturing the screen failed: {0}")]
    Failed(String),
}

/// A region of the screen: x, y, width, height.
pub type Region = (u32, u32, u32, u32);

/// PNG of the whole screen or of `region`.
pub fn screenshot(region: Option<Region>, screen: (u32, u32)) -> Result<Vec<u8>, CaptureError> {
    if let Some((x, y, width, height)) = region
        && (width == 0
            || height == 0
            || x.saturating_add(width) > screen.0
            || y.saturating_add(height) > screen.1)
    {
        return Err(CaptureError::Invalid(format!(
            "region {width}x{height}+{x}+{y} is empty or outside the {}x{} screen",
            screen.0, screen.1
        )));
    }
    // xcap opens several X connections per capture and, rarely, one of them fails.
    let image = capture(region).or_else(|_| capture(region))?;
    let mut png = Vec::new();
    image
        .write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
        .map_err(|error| CaptureError::Failed(error.to_string()))?;
    Ok(png)
}

fn capture(region: Option<Region>) -> Result<RgbaImage, CaptureError> {
    let failed = |error: xcap::XCapError| CaptureError::Failed(error.to_string());
    let monitor = Monitor::all()
        .map_err(failed)?
        .into_iter()
        .next()
        .ok_or_else(|| CaptureError::Failed("the display has no screen".into()))?;
    match region {
        Some((x, y, width, height)) => monitor.capture_region(x, y, width, height).map_err(failed),
        None => monitor.capture_image().map_err(failed),
    }
}
