//! A counting TCP proxy: forwards bytes both ways and counts, from the client side, the
//! connections accepted, the round trips (a client sending after it was last answered) and
//! the top-level RESP commands (arrays or inline commands; pipelined ones are several
//! commands in one round trip). The servers' own counters cannot tell a request from a
//! command run inside a script.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

/// Counters of one proxy.
#[derive(Debug, Default)]
pub struct Counts {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Round trips: client sends that follow a reply (or open the connection).
    pub round_trips: AtomicU64,
    /// Top-level commands sent by clients.
    pub commands: AtomicU64,
}

/// A running proxy in front of one server; stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The address clients use.
    pub port: u16,
    /// What passed through.
    pub counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let counts = Arc::new(Counts::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (counts.clone(), stop.clone());
        thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => {
                        c.connections.fetch_add(1, Ordering::Relaxed);
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        pipe(client, server, c.clone(), s.clone());
                    }
                    Err(_) => thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        Proxy { port, counts, stop }
    }

    /// The URL clients use.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// (connections, round trips, commands) so far.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.counts.connections.load(Ordering::Relaxed),
            self.counts.round_trips.load(Ordering::Relaxed),
            self.counts.commands.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn pipe(client: TcpStream, server: TcpStream, counts: Arc<Counts>, stop: Arc<AtomicBool>) {
    let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (mut s_read, mut c_write) = (server, client);
    let stop2 = stop.clone();
    // Set when the server has answered since the client last sent: the client's next
    // bytes start a new round trip. Set before the reply is forwarded, so the client
    // cannot send its next request before the flag is up.
    let answered = Arc::new(AtomicBool::new(true));
    let answered2 = answered.clone();
    thread::spawn(move || {
        let mut counter = RespCounter::default();
        let mut buf = [0u8; 16 * 1024];
        while !stop.load(Ordering::Acquire) {
            match c_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if answered.swap(false, Ordering::AcqRel) {
                        counts.round_trips.fetch_add(1, Ordering::Relaxed);
                    }
                    counts
                        .commands
                        .fetch_add(counter.feed(&buf[..n]), Ordering::Relaxed);
                    if s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = s_write.shutdown(Shutdown::Both);
    });
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        while !stop2.load(Ordering::Acquire) {
            match s_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    answered2.store(true, Ordering::Release);
                    if c_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = c_write.shutdown(Shutdown::Both);
    });
}

/// Counts complete top-level requests in a RESP byte stream fed in arbitrary pieces.
#[derive(Default)]
struct RespCounter {
    line: Vec<u8>,
    /// Bulk strings left in the current array.
    items_left: u64,
    /// Bytes of bulk payload (plus CRLF) left to skip.
    skip: u64,
}

impl RespCounter {
    fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut done = 0;
        while !data.is_empty() {
            if self.skip > 0 {
                let n = (self.skip as usize).min(data.len());
                self.skip -= n as u64;
                data = &data[n..];
                if self.skip == 0 && self.items_left == 0 {
                    done += 1;
                }
                continue;
            }
            let Some(pos) = data.iter().position(|b| *b == b'\n') else {
                self.line.extend_from_slice(data);
                break;
            };
            self.line.extend_from_slice(&data[..=pos]);
            data = &data[pos + 1..];
            let line = std::mem::take(&mut self.line);
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if let Some(n) = text.strip_prefix('*') {
                self.items_left = n.parse().unwrap_or(0);
                if self.items_left == 0 {
                    done += 1;
                }
            } else if let Some(len) = text.strip_prefix('$') {
                self.items_left = self.items_left.saturating_sub(1);
                self.skip = len.parse::<u64>().unwrap_or(0) + 2;
            } else if self.items_left == 0 && !text.is_empty() {
                done += 1; // an inline command
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_requests_split_anywhere() {
        let stream = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*1\r\n$4\r\nPING\r\nPING\r\n";
        for split in 0..stream.len() {
            let mut c = RespCounter::default();
            let n = c.feed(&stream[..split]) + c.feed(&stream[split..]);
            assert_eq!(n, 3, "split at {split}");
        }
    }
}
