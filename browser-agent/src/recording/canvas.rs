//! The recording's picture of the screen, in the encoder's input format: I420 (4:2:0 YUV,
//! BT.709, limited range), planes Y, U, V one after the other (ffmpeg's `yuv420p`). Only
//! the areas that changed are converted into it (with SIMD, dcv-color-primitives); each
//! frame handed to the encoder is a copy of the whole picture. The encoder then reads 12
//! instead of 32 bits per pixel through the pipe and skips its own (slower) conversion.
//!
//! 4:2:0 needs even sides and even positions, so areas are widened to even bounds and an
//! odd last row or column of the screen is left out.

use crate::damage::Rect;

pub struct Canvas {
    width: u16,
    height: u16,
    image: Vec<u8>,
    /// One converted area before it is copied into `image`.
    patch: Vec<u8>,
}

impl Canvas {
    /// A black picture of the even part of a `width` x `height` screen.
    pub fn new(width: u16, height: u16) -> Self {
        let (width, height) = (width & !1, height & !1);
        let luma = usize::from(width) * usize::from(height);
        let mut image = vec![16u8; luma * 3 / 2];
        image[luma..].fill(128);
        Self { width, height, image, patch: Vec::new() }
    }

    pub fn width(&self) -> u16 {
        self.width
    }

    pub fn height(&self) -> u16 {
        self.height
    }

    pub fn image(&self) -> &[u8] {
        &self.image
    }

    /// The smallest area with even bounds covering `rect` within the picture; `None` when
    /// `rect` lies only in the left-out odd row or column.
    pub fn aligned(&self, rect: Rect) -> Option<Rect> {
        let left = rect.x & !1;
        let top = rect.y & !1;
        let right = (u32::from(rect.x) + u32::from(rect.width) + 1).min(u32::from(self.width));
        let bottom = (u32::from(rect.y) + u32::from(rect.height) + 1).min(u32::from(self.height));
        let (right, bottom) = ((right & !1) as u16, (bottom & !1) as u16);
        (right > left && bottom > top).then(|| Rect {
            x: left,
            y: top,
            width: right - left,
            height: bottom - top,
        })
    }

    /// Converts `bgrx`, the area `rect` (from [`aligned`](Self::aligned): even bounds,
    /// not empty) as rows of `rect.width` B, G, R, X pixels, into the picture.
    pub fn paint(&mut self, rect: Rect, bgrx: &[u8]) -> Result<(), String> {
        use dcv_color_primitives::{ColorSpace, ImageFormat, PixelFormat, convert_image};
        let (width, height) = (usize::from(rect.width), usize::from(rect.height));
        let even = |value: usize| value.is_multiple_of(2);
        if width == 0
            || height == 0
            || !even(rect.x.into())
            || !even(rect.y.into())
            || !even(width)
            || !even(height)
            || usize::from(rect.x) + width > usize::from(self.width)
            || usize::from(rect.y) + height > usize::from(self.height)
        {
            return Err(format!("{rect:?} is not an even area of the picture"));
        }
        let source = ImageFormat {
            pixel_format: PixelFormat::Bgra,
            color_space: ColorSpace::Rgb,
            num_planes: 1,
        };
        let destination = ImageFormat {
            pixel_format: PixelFormat::I420,
            color_space: ColorSpace::Bt709,
            num_planes: 3,
        };
        let luma = width * height;
        self.patch.resize(luma * 3 / 2, 0);
        let (y, chroma) = self.patch.split_at_mut(luma);
        let (u, v) = chroma.split_at_mut(luma / 4);
        convert_image(
            u32::from(rect.width),
            u32::from(rect.height),
            &source,
            Some(&[width * 4]),
            &[bgrx],
            &destination,
            None,
            &mut [y, u, v],
        )
        .map_err(|error| format!("converting a frame: {error:?}"))?;

        // Row by row into the planes of the picture.
        let picture_luma = usize::from(self.width) * usize::from(self.height);
        let (picture_y, picture_chroma) = self.image.split_at_mut(picture_luma);
        let (picture_u, picture_v) = picture_chroma.split_at_mut(picture_luma / 4);
        let (x, top) = (usize::from(rect.x), usize::from(rect.y));
        let copy = |from: &[u8], to: &mut [u8], scale: usize| {
            let (stride, columns) = (usize::from(self.width) / scale, width / scale);
            for (row, source) in from.chunks_exact(columns).enumerate() {
                let at = (top / scale + row) * stride + x / scale;
                to[at..at + columns].copy_from_slice(source);
            }
        };
        let (y, chroma) = self.patch.split_at(luma);
        let (u, v) = chroma.split_at(luma / 4);
        copy(y, picture_y, 1);
        copy(u, picture_u, 2);
        copy(v, picture_v, 2);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rect(x: u16, y: u16, width: u16, height: u16) -> Rect {
        Rect { x, y, width, height }
    }

    #[test]
    fn areas_widen_to_even_bounds_inside_the_picture() {
        let canvas = Canvas::new(101, 51);
        assert_eq!((canvas.width(), canvas.height()), (100, 50));
        assert_eq!(canvas.aligned(rect(3, 5, 4, 1)), Some(rect(2, 4, 6, 2)));
        assert_eq!(canvas.aligned(rect(99, 49, 2, 2)), Some(rect(98, 48, 2, 2)));
        assert_eq!(canvas.aligned(rect(0, 0, 101, 51)), Some(rect(0, 0, 100, 50)));
        // Only the odd last column, which the picture leaves out.
        assert_eq!(canvas.aligned(rect(100, 0, 1, 10)), None);
    }

    #[test]
    fn a_painted_area_changes_exactly_its_pixels_in_every_plane() {
        let mut canvas = Canvas::new(8, 6);
        // A red 4x2 area at (2, 2): BT.709 limited range Y 63, U 102, V 240.
        let area = rect(2, 2, 4, 2);
        canvas.paint(area, &[0, 0, 255, 0].repeat(4 * 2)).expect("painted");
        let image = canvas.image();
        let (luma, chroma) = image.split_at(8 * 6);
        let (u, v) = chroma.split_at(4 * 3);
        let near = |actual: u8, expected: u8| actual.abs_diff(expected) <= 2;
        for y in 0..6 {
            for x in 0..8 {
                let inside = (2..6).contains(&x) && (2..4).contains(&y);
                let expected = if inside { 63 } else { 16 };
                assert!(near(luma[y * 8 + x], expected), "Y ({x}, {y}): {luma:?}");
            }
        }
        for (plane, red) in [(u, 102), (v, 240)] {
            for y in 0..3 {
                for x in 0..4 {
                    let inside = (1..3).contains(&x) && y == 1;
                    let expected = if inside { red } else { 128 };
                    assert!(near(plane[y * 4 + x], expected), "({x}, {y}): {plane:?}");
                }
            }
        }
        // Odd bounds are refused rather than smeared.
        assert!(canvas.paint(rect(1, 2, 2, 2), &[0; 16]).is_err());
        assert!(canvas.paint(rect(6, 4, 4, 2), &[0; 32]).is_err());
        assert!(canvas.paint(rect(2, 2, 0, 2), &[]).is_err());
    }
}
