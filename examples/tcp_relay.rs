//! A plain TCP relay with no protocol work: the floor of one extra hop, as a process of its own
//! like the proxy. `scripts/bench-kubectl.sh` puts it between kubectl and the simulated cluster
//! to measure what any process in the path costs on the machine.
//!
//!     cargo run --release --example tcp_relay -- LISTEN_ADDR UPSTREAM_ADDR
//!
//! It prints the bound address once it listens (so `127.0.0.1:0` works).

use tokio::net::{TcpListener, TcpStream};

/// The relay's buffer per direction: the proxy's largest read, so both make the same number of
/// system calls per byte.
const BUF: usize = 64 * 1024;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(upstream)) = (args.next(), args.next()) else {
        eprintln!("usage: tcp_relay LISTEN_ADDR UPSTREAM_ADDR");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen).await?;
    println!("{}", listener.local_addr()?);
    loop {
        let (mut client, _) = listener.accept().await?;
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let _ =
                tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, BUF, BUF).await;
        });
    }
}
