//! The CDP WebSocket of a local browser, passed through as bytes: the client's upgraded
//! connection on one side, Chromium's DevTools socket (handed over by the agent, its
//! handshake done) on the other. Frames are not decoded or re-encoded: client frames are
//! masked as a server expects them, Chromium's unmasked as a client does, and neither
//! side negotiated an extension. Only frame headers are read, to keep what the tunnel
//! over gRPC did: pinging a quiet client (at frame boundaries, so never inside one of
//! Chromium's messages), dropping the client's answers (Chromium never asked), ending
//! the connection of a client silent too long, and telling the client when the browser
//! went away.

use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::sessions::CdpConnectionGuard;

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const CLIENT_SILENCE_LIMIT: Duration = Duration::from_secs(90);
const BUFFER_BYTES: usize = 64 * 1024;

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

/// Moves bytes both ways until either side closes; the guard keeps the session counted
/// as in use meanwhile.
pub async fn splice<C>(client: C, chromium: tokio::net::TcpStream, _guard: CdpConnectionGuard)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (mut from_client, mut to_client) = tokio::io::split(client);
    let (mut from_chromium, mut to_chromium) = chromium.into_split();
    let opened = Instant::now();
    let last_heard = std::sync::atomic::AtomicU64::new(0);
    let client_closed = std::sync::atomic::AtomicBool::new(false);
    let heard = || {
        last_heard.store(
            opened.elapsed().as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        )
    };
    let upstream = async {
        let (mut buffer, mut out) = (vec![0u8; BUFFER_BYTES], Vec::with_capacity(BUFFER_BYTES));
        let mut frames = Frames::default();
        loop {
            let read = match from_client.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            heard();
            out.clear();
            frames.forward(&buffer[..read], &mut out, |opcode| opcode == OPCODE_PONG);
            if frames.closed {
                client_closed.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if !out.is_empty() && to_chromium.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = to_chromium.shutdown().await;
    };
    let downstream = async {
        let (mut buffer, mut out) = (vec![0u8; BUFFER_BYTES], Vec::with_capacity(BUFFER_BYTES));
        let mut frames = Frames::default();
        let mut keepalive = tokio::time::interval(KEEPALIVE_INTERVAL);
        keepalive.tick().await; // the first tick is immediate
        let mut ping_due = false;
        loop {
            out.clear();
            tokio::select! {
                read = from_chromium.read(&mut buffer) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(read) => {
                        // A due ping goes between two of Chromium's frames.
                        let mut rest = &buffer[..read];
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
                        if ping_due && frames.at_boundary() {
                            out.extend_from_slice(&PING);
                            ping_due = false;
                        }
                    }
                },
                _ = keepalive.tick() => {
                    let heard_at = Duration::from_millis(
                        last_heard.load(std::sync::atomic::Ordering::Relaxed));
                    if opened.elapsed().saturating_sub(heard_at) > CLIENT_SILENCE_LIMIT {
                        return;
                    }
                    if frames.at_boundary() {
                        out.extend_from_slice(&PING);
                    } else {
                        ping_due = true;
                    }
                }
            }
            if !out.is_empty() && to_client.write_all(&out).await.is_err() {
                return;
            }
        }
        // Chromium went away without a closing handshake: tell the client rather than
        // leave it hanging (between frames only; a frame cut short cannot be completed).
        let handshake = frames.closed || client_closed.load(std::sync::atomic::Ordering::Relaxed);
        if frames.at_boundary() && !handshake {
            let reason = b"browser went away";
            let mut close = vec![0x88, (2 + reason.len()) as u8];
            close.extend_from_slice(&1011u16.to_be_bytes());
            close.extend_from_slice(reason);
            let _ = to_client.write_all(&close).await;
        }
        let _ = to_client.shutdown().await;
    };
    tokio::select! {
        () = upstream => {},
        () = downstream => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn frames_pass_whole_and_pongs_are_dropped_however_the_bytes_are_cut() {
        let key = Some([1, 2, 3, 4]);
        let text = frame(0x1, b"{\"id\":1}", key);
        let pong = frame(OPCODE_PONG, b"", key);
        let big = frame(0x1, &vec![b'x'; 70_000], key);
        let medium = frame(0x2, &vec![7u8; 300], key);
        let stream = [
            text.clone(),
            pong.clone(),
            big.clone(),
            pong,
            medium.clone(),
        ]
        .concat();
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
        frames.forward(
            &frame(OPCODE_CLOSE, &1000u16.to_be_bytes(), None),
            &mut out,
            |_| false,
        );
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
