//! The CDP WebSocket of a local browser, passed through as bytes: the client's upgraded
//! connection on one side, Chromium's DevTools socket (handed over by the agent, its
//! handshake done) on the other. Frames are not decoded or re-encoded: client frames are
//! masked as a server expects them, Chromium's unmasked as a client does, and neither
//! side negotiated an extension. Only frame headers are read, to keep what the tunnel
//! over gRPC did: pinging a quiet client (at frame boundaries, so never inside one of
//! Chromium's messages), dropping the client's answers (Chromium never asked), ending
//! the connection of a client silent too long, and telling the client when the browser
//! went away.
//!
//! Each direction is a thread of its own doing blocking reads and writes, out of the
//! async runtime: a message then costs one thread wake-up and two system calls in this
//! process, as in the smallest relay one could write in C (`bench/scenarios/cdp_overhead.py`
//! measured the difference: async tasks added about 10 µs to a 0.3 ms round trip).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use socket2::Socket;

use crate::sessions::CdpConnectionGuard;
use crate::telemetry::cdp_commands::{CommandRecorder, MAX_COMMAND_BYTES};

/// We ping a quiet client this often; one that has sent nothing (not even a pong) for
/// three of these is gone, and its connection stops keeping the session alive.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const SILENT_INTERVALS: u32 = 3;
const BUFFER_BYTES: usize = 64 * 1024;
/// The threads' buffers are on the heap: a small stack will do.
const THREAD_STACK_BYTES: usize = 256 * 1024;

const OPCODE_CONTINUATION: u8 = 0x0;
const OPCODE_TEXT: u8 = 0x1;
const OPCODE_BINARY: u8 = 0x2;
const OPCODE_CLOSE: u8 = 0x8;
const OPCODE_PONG: u8 = 0xA;
/// An empty ping, as a server sends it (unmasked).
const PING: [u8; 2] = [0x89, 0x00];

/// Where a byte stream of WebSocket frames stands: inside a header (its bytes so far),
/// or inside a payload (how much is left, and whether it is forwarded).
#[derive(Default)]
struct Frames {
    header: Vec<u8>,
    payload_left: u64,
    dropping: bool,
    /// A close frame went through: the closing handshake is the two ends' own.
    closed: bool,
}

impl Frames {
    fn at_boundary(&self) -> bool {
        self.header.is_empty() && self.payload_left == 0
    }

    /// The length of a complete frame header in `header`, and its payload length.
    fn parse_header(header: &[u8]) -> Option<(usize, u64)> {
        let [_, second, ..] = header else { return None };
        let masked = second & 0x80 != 0;
        let (mut length, extended) = match second & 0x7f {
            126 => (0, 2),
            127 => (0, 8),
            short => (u64::from(short), 0),
        };
        let size = 2 + extended + if masked { 4 } else { 0 };
        if header.len() < size {
            return None;
        }
        for byte in &header[2..2 + extended] {
            length = (length << 8) | u64::from(*byte);
        }
        Some((size, length))
    }

    /// Appends to `out` what of `data` is forwarded: every frame but those `drop`
    /// chooses by opcode.
    fn forward(&mut self, mut data: &[u8], out: &mut Vec<u8>, drop: impl Fn(u8) -> bool) {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let take = data.len().min(self.payload_left as usize);
                if !self.dropping {
                    out.extend_from_slice(&data[..take]);
                }
                self.payload_left -= take as u64;
                data = &data[take..];
                continue;
            }
            self.header.push(data[0]);
            data = &data[1..];
            if let Some((_, length)) = Self::parse_header(&self.header) {
                let opcode = self.header[0] & 0x0f;
                self.dropping = drop(opcode);
                if !self.dropping {
                    out.extend_from_slice(&self.header);
                    self.closed |= opcode == OPCODE_CLOSE;
                }
                self.header.clear();
                self.payload_left = length;
            }
        }
    }
}

/// The client's text messages, unmasked, as its frames pass (for `cdp_command` events);
/// a message longer than `MAX_COMMAND_BYTES` is skipped.
struct MessageTap<F: FnMut(&[u8])> {
    header: Vec<u8>,
    mask: [u8; 4],
    /// How far into the current frame's payload, and how much of it is left.
    offset: usize,
    payload_left: u64,
    final_frame: bool,
    /// The current frame belongs to the text message being assembled.
    keeping: bool,
    /// A text message is being assembled (over continuation frames).
    in_text: bool,
    too_long: bool,
    message: Vec<u8>,
    on_message: F,
}

impl<F: FnMut(&[u8])> MessageTap<F> {
    fn new(on_message: F) -> Self {
        Self {
            header: Vec::new(),
            mask: [0; 4],
            offset: 0,
            payload_left: 0,
            final_frame: false,
            keeping: false,
            in_text: false,
            too_long: false,
            message: Vec::new(),
            on_message,
        }
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.payload_left > 0 {
                let take = data.len().min(self.payload_left as usize);
                if self.keeping && !self.too_long {
                    if self.message.len() + take > MAX_COMMAND_BYTES {
                        self.too_long = true;
                        self.message = Vec::new();
                    } else {
                        let (mask, offset) = (self.mask, self.offset);
                        self.message.extend(
                            data[..take]
                                .iter()
                                .enumerate()
                                .map(|(index, byte)| byte ^ mask[(offset + index) % 4]),
                        );
                    }
                }
                self.offset += take;
                self.payload_left -= take as u64;
                data = &data[take..];
                if self.payload_left == 0 {
                    self.frame_done();
                }
                continue;
            }
            self.header.push(data[0]);
            data = &data[1..];
            let Some((size, length)) = Frames::parse_header(&self.header) else {
                continue;
            };
            let opcode = self.header[0] & 0x0f;
            self.final_frame = self.header[0] & 0x80 != 0;
            self.mask = match self.header[1] & 0x80 {
                0 => [0; 4],
                _ => [
                    self.header[size - 4],
                    self.header[size - 3],
                    self.header[size - 2],
                    self.header[size - 1],
                ],
            };
            self.header.clear();
            self.offset = 0;
            self.payload_left = length;
            self.keeping = match opcode {
                OPCODE_TEXT => {
                    self.in_text = true;
                    self.too_long = false;
                    self.message.clear();
                    true
                }
                OPCODE_CONTINUATION => self.in_text,
                OPCODE_BINARY => {
                    self.in_text = false;
                    false
                }
                // Control frames may come between a message's fragments.
                _ => false,
            };
            if length == 0 {
                self.frame_done();
            }
        }
    }

    fn frame_done(&mut self) {
        if self.keeping && self.final_frame {
            if !self.too_long {
                (self.on_message)(&self.message);
            }
            self.message.clear();
            self.in_text = false;
        }
        self.keeping = false;
    }
}

/// The client's socket out of hyper's upgraded connection, with the bytes hyper read
/// past the handshake; `None` for a connection that is not a plain socket.
fn client_socket(upgraded: Upgraded) -> Option<(Socket, Bytes)> {
    use hyper_util::server::conn::auto::upgrade::downcast;
    let (fd, early): (OwnedFd, _) = match downcast::<TokioIo<tokio::net::TcpStream>>(upgraded) {
        Ok(parts) => (parts.io.into_inner().into_std().ok()?.into(), parts.read_buf),
        Err(upgraded) => {
            let parts = downcast::<TokioIo<tokio::net::UnixStream>>(upgraded).ok()?;
            (parts.io.into_inner().into_std().ok()?.into(), parts.read_buf)
        }
    };
    let socket = Socket::from(fd);
    socket.set_nonblocking(false).ok()?;
    Some((socket, early))
}

/// Passes bytes both ways, on two threads, until either side closes; the guard keeps the
/// session counted as in use meanwhile.
pub fn start(upgraded: Upgraded, chromium: tokio::net::TcpStream, guard: CdpConnectionGuard) {
    let Some((client, early)) = client_socket(upgraded) else {
        tracing::warn!("a CDP client connection is not a socket; closing it");
        return;
    };
    // Out of the runtime, where it was non-blocking.
    let chromium = chromium
        .into_std()
        .map(|chromium| Socket::from(OwnedFd::from(chromium)))
        .and_then(|chromium| chromium.set_nonblocking(false).map(|()| chromium));
    let chromium = match chromium {
        Ok(chromium) => chromium,
        Err(error) => {
            tracing::warn!(%error, "could not take over the DevTools socket");
            return;
        }
    };
    let commands = guard.command_recorder();
    let splice = Splice::new(client, chromium, KEEPALIVE_INTERVAL);
    if let Err(error) = splice.start(early, commands, guard) {
        tracing::warn!(%error, "could not start a CDP pass-through thread");
    }
}

/// One pass-through connection, shared by its two threads.
struct Splice {
    keepalive: Duration,
    opened: Instant,
    /// When the client last sent anything, in milliseconds since `opened`.
    last_heard_ms: AtomicU64,
    /// The client ended the connection (or broke it): no close frame is owed to it.
    client_gone: AtomicBool,
    client: Socket,
    chromium: Socket,
}

impl Splice {
    fn new(client: Socket, chromium: Socket, keepalive: Duration) -> Self {
        Self {
            keepalive,
            opened: Instant::now(),
            last_heard_ms: AtomicU64::new(0),
            client_gone: AtomicBool::new(false),
            client,
            chromium,
        }
    }

    /// Starts both threads; `guard` is dropped once both have ended.
    fn start<G: Send + 'static>(
        self, early: Bytes, commands: Option<CommandRecorder>, guard: G,
    ) -> io::Result<()> {
        let this = Arc::new(self);
        let up = this.clone();
        let upstream = std::thread::Builder::new()
            .name("cdp-upstream".into())
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || up.upstream(&early, commands))?;
        let down = this.clone();
        std::thread::Builder::new()
            .name("cdp-downstream".into())
            .stack_size(THREAD_STACK_BYTES)
            .spawn(move || {
                down.downstream();
                // Either direction ending ends both: wakes the other from its read.
                down.end();
                let _ = upstream.join();
                drop(guard);
            })
            // The upstream thread is running: end it too.
            .inspect_err(|_| this.end())?;
        Ok(())
    }

    fn end(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.chromium.shutdown(Shutdown::Both);
    }

    /// The client's frames to Chromium, but its pongs; its commands to `commands`.
    fn upstream(&self, early: &[u8], commands: Option<CommandRecorder>) {
        let mut frames = Frames::default();
        let mut out = Vec::with_capacity(BUFFER_BYTES);
        let mut tap = commands
            .map(|commands| MessageTap::new(move |message: &[u8]| commands.record(message)));
        let mut pass = |data: &[u8]| {
            self.last_heard_ms.store(self.opened.elapsed().as_millis() as u64, Ordering::Relaxed);
            if let Some(tap) = &mut tap {
                tap.feed(data);
            }
            out.clear();
            frames.forward(data, &mut out, |opcode| opcode == OPCODE_PONG);
            if frames.closed {
                self.client_gone.store(true, Ordering::SeqCst);
            }
            out.is_empty() || (&self.chromium).write_all(&out).is_ok()
        };
        // What hyper read past the handshake goes first.
        let mut client_left = false;
        if early.is_empty() || pass(early) {
            let mut buffer = vec![0u8; BUFFER_BYTES];
            client_left = loop {
                match (&self.client).read(&mut buffer) {
                    Ok(0) => break true,
                    Ok(read) if pass(&buffer[..read]) => {}
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break true,
                    // Writing to Chromium failed.
                    Ok(_) => break false,
                }
            };
        }
        if client_left {
            self.client_gone.store(true, Ordering::SeqCst);
            self.end();
        } else {
            // Chromium is gone: the downstream thread sees it and tells the client.
            let _ = self.chromium.shutdown(Shutdown::Both);
        }
    }

    /// Chromium's frames to the client, with a ping between two of them when one is due.
    fn downstream(&self) {
        let mut frames = Frames::default();
        let mut out = Vec::with_capacity(BUFFER_BYTES);
        let mut buffer = vec![0u8; BUFFER_BYTES];
        // A quiet Chromium still lets the keepalive run (a ping at most half an interval
        // late), and so does a client that stopped reading (its silence is then checked).
        let wait = Some(self.keepalive / 2);
        if self.chromium.set_read_timeout(wait).is_err()
            || self.client.set_write_timeout(wait).is_err()
        {
            return;
        }
        let mut next_ping = Instant::now() + self.keepalive;
        let mut ping_due = false;
        loop {
            out.clear();
            match (&self.chromium).read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => {
                    let mut rest = &buffer[..read];
                    // A due ping goes between two of Chromium's frames.
                    while ping_due && !rest.is_empty() {
                        if frames.at_boundary() {
                            out.extend_from_slice(&PING);
                            ping_due = false;
                            break;
                        }
                        // The rest of this payload at once; a header byte by byte.
                        let step = match frames.payload_left {
                            0 => 1,
                            left => rest.len().min(left as usize),
                        };
                        frames.forward(&rest[..step], &mut out, |_| false);
                        rest = &rest[step..];
                    }
                    frames.forward(rest, &mut out, |_| false);
                }
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            if Instant::now() >= next_ping {
                next_ping = Instant::now() + self.keepalive;
                if self.client_silent_too_long() {
                    return;
                }
                ping_due = true;
            }
            if ping_due && frames.at_boundary() {
                out.extend_from_slice(&PING);
                ping_due = false;
            }
            if !out.is_empty() && !self.send_to_client(&out) {
                return;
            }
        }
        // Chromium went away without a closing handshake: tell the client rather than
        // leave it hanging (between frames only; a frame cut short cannot be completed).
        let handshake = frames.closed || self.client_gone.load(Ordering::SeqCst);
        if frames.at_boundary() && !handshake {
            let reason = b"browser went away";
            let mut close = vec![0x88, (2 + reason.len()) as u8];
            close.extend_from_slice(&1011u16.to_be_bytes());
            close.extend_from_slice(reason);
            let _ = self.send_to_client(&close);
        }
    }

    fn client_silent_too_long(&self) -> bool {
        let heard = Duration::from_millis(self.last_heard_ms.load(Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(heard) > self.keepalive * SILENT_INTERVALS
    }

    /// Writes all of `data` to the client; false once that failed, or the client has
    /// neither read nor sent anything for too long.
    fn send_to_client(&self, mut data: &[u8]) -> bool {
        while !data.is_empty() {
            match (&self.client).write(data) {
                Ok(0) => return false,
                Ok(written) => data = &data[written..],
                Err(error)
                    if matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if self.client_silent_too_long() {
                        return false;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::mpsc;

    /// A pass-through between two socket pairs: the test's ends of the client's and of
    /// Chromium's connections, and a channel that says when the guard was dropped.
    struct Ends {
        client: UnixStream,
        chromium: UnixStream,
        ended: mpsc::Receiver<()>,
    }

    struct Guard(mpsc::Sender<()>);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    fn splice(early: &[u8], keepalive: Duration) -> Ends {
        let (client, client_end) = UnixStream::pair().unwrap();
        let (chromium, chromium_end) = UnixStream::pair().unwrap();
        let (sender, ended) = mpsc::channel();
        Splice::new(
            Socket::from(OwnedFd::from(client_end)),
            Socket::from(OwnedFd::from(chromium_end)),
            keepalive,
        )
        .start(Bytes::copy_from_slice(early), None, Guard(sender))
        .unwrap();
        for end in [&client, &chromium] {
            end.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        Ends { client, chromium, ended }
    }

    fn read_exactly(mut from: &UnixStream, length: usize) -> Vec<u8> {
        let mut data = vec![0u8; length];
        from.read_exact(&mut data).unwrap();
        data
    }

    fn read_to_end(mut from: &UnixStream) -> Vec<u8> {
        let mut data = Vec::new();
        from.read_to_end(&mut data).unwrap();
        data
    }

    #[test]
    fn bytes_pass_both_ways_early_ones_first_and_pongs_stay_behind() {
        let key = Some([9, 8, 7, 6]);
        let early = frame(0x1, b"{\"id\":1}", key);
        let ends = splice(&early, Duration::from_secs(30));
        let later = [frame(OPCODE_PONG, b"", key), frame(0x1, b"{\"id\":2}", key)].concat();
        (&ends.client).write_all(&later).unwrap();
        let expected = [early, frame(0x1, b"{\"id\":2}", key)].concat();
        assert_eq!(read_exactly(&ends.chromium, expected.len()), expected);
        let answer = frame(0x1, &vec![b'r'; 100_000], None);
        (&ends.chromium).write_all(&answer).unwrap();
        assert_eq!(read_exactly(&ends.client, answer.len()), answer);
        // The client leaves: Chromium's connection ends, and no close frame is made up
        // for a client that is gone.
        drop(ends.client);
        assert_eq!(read_to_end(&ends.chromium), b"");
        ends.ended.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_quiet_client_is_pinged_between_chromium_s_frames_and_a_silent_one_let_go() {
        let keepalive = Duration::from_millis(400);
        let ends = splice(b"", keepalive);
        // Half of a frame from Chromium, then a pause past the keepalive: the ping waits
        // for the frame's end.
        let message = frame(0x1, b"{\"method\":\"Page.loadEventFired\"}", None);
        (&ends.chromium).write_all(&message[..5]).unwrap();
        std::thread::sleep(keepalive * 3 / 2);
        (&ends.chromium).write_all(&message[5..]).unwrap();
        assert_eq!(
            read_exactly(&ends.client, message.len() + PING.len()),
            [message.clone(), PING.to_vec()].concat()
        );
        // Answered, pings go on past three intervals; the answers stay here.
        let pong = frame(OPCODE_PONG, b"", Some([1, 2, 3, 4]));
        (&ends.client).write_all(&pong).unwrap();
        for _ in 0..4 {
            assert_eq!(read_exactly(&ends.client, PING.len()), PING);
            (&ends.client).write_all(&pong).unwrap();
        }
        ends.chromium.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let nothing = (&ends.chromium).read(&mut byte).unwrap_err();
        assert_eq!(nothing.kind(), io::ErrorKind::WouldBlock);
        // Unanswered, the connection ends after three intervals of silence.
        let silent_since = Instant::now();
        let rest = read_to_end(&ends.client);
        assert!(rest.chunks(2).all(|ping| ping == PING), "{rest:?}");
        assert!(silent_since.elapsed() >= keepalive * 2);
        ends.ended.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn a_client_that_neither_reads_nor_sends_is_let_go_while_chromium_streams() {
        let ends = splice(b"", Duration::from_millis(200));
        let chromium = ends.chromium.try_clone().unwrap();
        let streaming = std::thread::spawn(move || {
            let event = frame(0x1, &vec![b'e'; 60_000], None);
            while (&chromium).write_all(&event).is_ok() {}
        });
        // Its buffers full, the writes to it wait; past the silence limit, it is gone.
        ends.ended.recv_timeout(Duration::from_secs(10)).unwrap();
        streaming.join().unwrap();
    }

    #[test]
    fn the_client_is_told_when_chromium_goes_away_between_frames() {
        let ends = splice(b"", Duration::from_secs(30));
        let message = frame(0x1, b"{}", None);
        (&ends.chromium).write_all(&message).unwrap();
        drop(ends.chromium);
        let mut close = vec![0x88, 19];
        close.extend_from_slice(&1011u16.to_be_bytes());
        close.extend_from_slice(b"browser went away");
        assert_eq!(read_to_end(&ends.client), [message, close].concat());
        ends.ended.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    fn frame(opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut out = vec![0x80 | opcode];
        let mask_bit = if mask.is_some() { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(mask_bit | n as u8),
            n if n < 65536 => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if let Some(key) = mask {
            out.extend_from_slice(&key);
        }
        out.extend_from_slice(payload);
        out
    }

    /// A client's frame: masked, FIN as given.
    fn masked(opcode: u8, fin: bool, payload: &[u8], key: [u8; 4]) -> Vec<u8> {
        let scrambled: Vec<u8> =
            payload.iter().enumerate().map(|(index, byte)| byte ^ key[index % 4]).collect();
        let mut out = frame(opcode, &scrambled, Some(key));
        if !fin {
            out[0] &= 0x7f;
        }
        out
    }

    #[test]
    fn the_tap_sees_each_text_message_whole_however_it_is_fragmented_or_cut() {
        let key = [0x12, 0x34, 0x56, 0x78];
        let long = "x".repeat(70_000);
        let stream = [
            masked(OPCODE_TEXT, true, b"{\"id\":1}", key),
            // Fragmented, with a ping between the fragments.
            masked(OPCODE_TEXT, false, b"{\"id\":", key),
            masked(0x9, true, b"", key),
            masked(OPCODE_CONTINUATION, true, b"2}", [9, 8, 7, 6]),
            masked(OPCODE_BINARY, true, b"binary", key),
            masked(OPCODE_TEXT, true, long.as_bytes(), key),
            masked(OPCODE_TEXT, true, b"", key),
        ]
        .concat();
        for cut in [1, 3, 7, 4096, stream.len()] {
            let mut seen: Vec<Vec<u8>> = Vec::new();
            let mut tap = MessageTap::new(|message: &[u8]| seen.push(message.to_vec()));
            for chunk in stream.chunks(cut) {
                tap.feed(chunk);
            }
            drop(tap);
            assert_eq!(
                seen,
                [
                    b"{\"id\":1}".to_vec(),
                    b"{\"id\":2}".to_vec(),
                    long.clone().into_bytes(),
                    Vec::new()
                ],
                "cut every {cut} bytes"
            );
        }
    }

    #[test]
    fn frames_pass_whole_and_pongs_are_dropped_however_the_bytes_are_cut() {
        let key = Some([1, 2, 3, 4]);
        let text = frame(0x1, b"{\"id\":1}", key);
        let pong = frame(OPCODE_PONG, b"", key);
        let big = frame(0x1, &vec![b'x'; 70_000], key);
        let medium = frame(0x2, &vec![7u8; 300], key);
        let stream = [text.clone(), pong.clone(), big.clone(), pong, medium.clone()].concat();
        let expected = [text, big, medium].concat();
        for cut in [1, 2, 3, 7, 100, 65_536, stream.len()] {
            let mut frames = Frames::default();
            let mut out = Vec::new();
            for piece in stream.chunks(cut) {
                frames.forward(piece, &mut out, |opcode| opcode == OPCODE_PONG);
            }
            assert_eq!(out, expected, "cut into pieces of {cut}");
            assert!(frames.at_boundary());
        }
    }

    #[test]
    fn a_close_frame_is_noticed() {
        let mut frames = Frames::default();
        let mut out = Vec::new();
        frames.forward(&frame(0x1, b"{}", None), &mut out, |_| false);
        assert!(!frames.closed);
        frames.forward(&frame(OPCODE_CLOSE, &1000u16.to_be_bytes(), None), &mut out, |_| false);
        assert!(frames.closed);
    }

    #[test]
    fn a_boundary_is_known_only_between_frames() {
        let mut frames = Frames::default();
        let mut out = Vec::new();
        let message = frame(0x1, b"hello", None);
        frames.forward(&message[..3], &mut out, |_| false);
        assert!(!frames.at_boundary());
        frames.forward(&message[3..], &mut out, |_| false);
        assert!(frames.at_boundary());
        assert_eq!(out, message);
    }
}
