//! Benchmark reference: the cheapest process hop there is, for `cdp_overhead`. Accepts
//! TCP connections on 127.0.0.1 (a free port, printed on stdout) and relays each to
//! 127.0.0.1:TARGET with a blocking thread per direction, reading nothing of the bytes.
//! The CDP pass-through does what this does plus the WebSocket bookkeeping, so the two
//! side by side show what that bookkeeping costs and what the hop itself does.
//!
//!     minimal_relay TARGET_PORT

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = vec![0u8; 64 * 1024];
    while let Ok(read @ 1..) = from.read(&mut buffer) {
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn main() -> std::io::Result<()> {
    let target: u16 = match std::env::args().nth(1).map(|port| port.parse()) {
        Some(Ok(port)) => port,
        _ => {
            eprintln!("usage: minimal_relay TARGET_PORT");
            std::process::exit(2);
        }
    };
    let listener = TcpListener::bind(("127.0.0.1", 0))?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    for client in listener.incoming() {
        let client = client?;
        let server = TcpStream::connect(("127.0.0.1", target))?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let (client_reader, server_reader) = (client.try_clone()?, server.try_clone()?);
        std::thread::spawn(move || pipe(client_reader, server));
        std::thread::spawn(move || pipe(server_reader, client));
    }
    Ok(())
}
