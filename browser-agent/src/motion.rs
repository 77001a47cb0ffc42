//! Human-like pointer motion: a curved path (a cubic Bézier whose control points lie to
//! one side of the straight line) travelled with ease-in-out speed, sampled at a fixed
//! rate and timed against the clock, so that a motion takes the duration asked for.

use std::time::Duration;

/// Time between two pointer events of a motion (about 120 Hz, a fast mouse's rate).
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(8);
/// The duration of a motion given no duration: quick for short distances, at most 1.2 s.
pub fn default_duration(distance: f64) -> Duration {
    Duration::from_millis((120.0 + distance * 0.5).min(1200.0) as u64)
}

pub fn distance(from: (i32, i32), to: (i32, i32)) -> f64 {
    let (dx, dy) = ((to.0 - from.0) as f64, (to.1 - from.1) as f64);
    (dx * dx + dy * dy).sqrt()
}

/// The points of a motion from `from` to `to` taking `duration`, each with its time from
/// the motion's start; the last is exactly `to` at `duration`. `from` itself is not
/// included (the pointer is already there).
pub fn curve(from: (i32, i32), to: (i32, i32), duration: Duration) -> Vec<((i32, i32), Duration)> {
    let length = distance(from, to);
    let samples = (duration.as_secs_f64() / SAMPLE_INTERVAL.as_secs_f64()).ceil().max(1.0) as u32;
    if length < 1.0 {
        return vec![(to, duration)];
    }
    let (x0, y0) = (from.0 as f64, from.1 as f64);
    let (x3, y3) = (to.0 as f64, to.1 as f64);
    let (ux, uy) = ((x3 - x0) / length, (y3 - y0) / length);
    // Sideways, by a fraction of the distance that varies with the endpoints (not random:
    // the same request makes the same motion), alternating sides.
    let seed = (from.0 as i64 * 31 + from.1 as i64 * 17 + to.0 as i64 * 13 + to.1 as i64 * 7)
        .rem_euclid(97);
    let bend = (0.08 + (seed as f64 / 97.0) * 0.17) * if seed % 2 == 0 { 1.0 } else { -1.0 };
    let (nx, ny) = (-uy * length * bend, ux * length * bend);
    let (x1, y1) = (x0 + (x3 - x0) * 0.3 + nx, y0 + (y3 - y0) * 0.3 + ny);
    let (x2, y2) = (x0 + (x3 - x0) * 0.7 + nx * 0.6, y0 + (y3 - y0) * 0.7 + ny * 0.6);
    let mut points = Vec::with_capacity(samples as usize);
    for index in 1..=samples {
        let progress = f64::from(index) / f64::from(samples);
        // Smoothstep: slow start, fast middle, slow end.
        let t = progress * progress * (3.0 - 2.0 * progress);
        let u = 1.0 - t;
        let x = u * u * u * x0 + 3.0 * u * u * t * x1 + 3.0 * u * t * t * x2 + t * t * t * x3;
        let y = u * u * u * y0 + 3.0 * u * u * t * y1 + 3.0 * u * t * t * y2 + t * t * t * y3;
        let at = duration.mul_f64(progress);
        let point = if index == samples { to } else { (x.round() as i32, y.round() as i32) };
        if points.last().map(|(last, _)| *last) != Some(point) || index == samples {
            points.push((point, at));
        }
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curve_ends_where_asked_when_asked_and_bends() {
        let duration = Duration::from_millis(600);
        let points = curve((100, 100), (900, 600), duration);
        assert_eq!(points.last(), Some(&((900, 600), duration)));
        assert!(points.len() > 30, "{}", points.len());
        // Away from the straight line somewhere in the middle.
        let off_line = points.iter().map(|((x, y), _)| {
            let (dx, dy) = (800.0, 500.0);
            ((*x as f64 - 100.0) * dy - (*y as f64 - 100.0) * dx).abs() / (dx * dx + dy * dy).sqrt()
        });
        assert!(off_line.fold(0.0, f64::max) > 20.0);
        // Times only grow.
        assert!(points.windows(2).all(|pair| pair[0].1 < pair[1].1));
    }

    #[test]
    fn no_distance_is_one_point() {
        let points = curve((5, 5), (5, 5), Duration::from_millis(100));
        assert_eq!(points, vec![((5, 5), Duration::from_millis(100))]);
    }
}
