//! Benchmark reference: in-process enigo clicks (the agent's own input path, minus the
//! API). Clicks once per line read on stdin (or N times back to back for a line `N`) and
//! answers the duration in microseconds, so a benchmark can interleave it with other ways
//! of clicking.
//!
//!     click_latency :DISPLAY X Y
#![allow(clippy::expect_used)]

use std::io::{BufRead, Write};
use std::time::Instant;

use enigo::{Button, Coordinate, Direction, Enigo, Mouse, Settings};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, display, x, y] = args.as_slice() else {
        eprintln!("usage: click_latency :DISPLAY X Y");
        std::process::exit(2);
    };
    let (x, y): (i32, i32) = (x.parse().expect("x"), y.parse().expect("y"));
    let mut enigo = Enigo::new(&Settings {
        linux_delay: 0,
        x11_display: Some(display.clone()),
        ..Settings::default()
    })
    .expect("connect to the display");
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let clicks: u32 = line.expect("stdin").trim().parse().unwrap_or(1);
        let started = Instant::now();
        for _ in 0..clicks {
            enigo.move_mouse(x, y, Coordinate::Abs).expect("move");
            // enigo syncs with the X server after every event: when this returns, the
            // server has processed the click, as when the API answers.
            enigo.button(Button::Left, Direction::Click).expect("click");
        }
        writeln!(out, "{}", started.elapsed().as_micros()).expect("stdout");
        out.flush().expect("stdout");
    }
}
