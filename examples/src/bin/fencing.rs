//! Kleppmann's fencing scenario, made real.
//!
//! Client 1 takes the lock and pauses (a GC pause, a swapped-out process) longer than its
//! lease. Client 2 takes the lock and writes to the storage. Client 1 wakes up and writes
//! as if it still held the lock: the storage checks fencing tokens and refuses it.
//!
//! ```text
//! cargo run -p dlm-examples --bin fencing [-- --redis URL[,URL...]]
//! ```
//! On Redis, the storage is a value in the first server, written with
//! `dlm_redis::fenced_set`; on the memory backend, a `dlm_core::FencedResource`. The exit
//! status is 0 when the stale write was refused.

use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use dlm_core::{FencedResource, FencingToken, Lock, LockClient};
use dlm_examples::Args;
use dlm_redis::redis;

/// The protected storage.
enum Storage {
    Memory(FencedResource<String>),
    Redis(redis::Connection, String),
}

impl Storage {
    fn write(&mut self, token: FencingToken, value: &str) -> Result<(), String> {
        match self {
            Storage::Memory(r) => r
                .write(token, |v| *v = value.to_owned())
                .map_err(|e| e.to_string()),
            Storage::Redis(con, key) => {
                dlm_redis::fenced_set(con, key, token, value.as_bytes()).map_err(|e| e.to_string())
            }
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args::from_env("fencing", "[--redis URL[,URL...]]");
    let first_url = args
        .peek("--redis")
        .and_then(|urls| urls.split(',').next().map(str::to_owned));
    let backend = args.backend();
    args.finish();
    let name = format!("fencing-demo-{}", std::process::id());
    let mut storage = match first_url {
        None => Storage::Memory(FencedResource::new(String::new())),
        Some(url) => {
            let con = redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .unwrap_or_else(|e| args.fail(&format!("cannot connect to {url}: {e}")));
            Storage::Redis(con, format!("{name}:storage"))
        }
    };

    let lease = Duration::from_millis(500);
    let client1 = LockClient::builder(backend.clone())
        .lease(lease)
        .build()
        .unwrap();
    let client2 = LockClient::builder(backend).build().unwrap();

    let g1 = client1
        .get_lock(&name)
        .unwrap()
        .lock()
        .expect("client 1 locks");
    let t1 = g1
        .fencing_token()
        .expect("the backend issues fencing tokens");
    println!("client 1: acquired the lock with token {t1}, lease {lease:?}");
    println!(
        "client 1: pauses for {:?} (longer than its lease)",
        lease * 3
    );
    let pause = thread::spawn(move || thread::sleep(lease * 3));

    let g2 = client2
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .expect("client 2 locks")
        .expect("client 1's lease ran out");
    let t2 = g2.fencing_token().expect("token");
    println!("client 2: acquired the lock with token {t2} after client 1's lease ran out");
    storage
        .write(t2, "written by client 2")
        .expect("client 2 writes");
    println!("client 2: wrote with token {t2}: accepted");
    g2.unlock().expect("client 2 unlocks");

    pause.join().unwrap();
    println!(
        "client 1: wakes up; its guard says is_held={} (it should check, but suppose it does not)",
        g1.is_held()
    );
    match storage.write(t1, "written by client 1") {
        Err(e) => {
            println!("client 1: wrote with token {t1}: REFUSED ({e})");
            println!("stale write refused");
            ExitCode::SUCCESS
        }
        Ok(()) => {
            println!("client 1: wrote with token {t1}: accepted (fencing failed!)");
            ExitCode::FAILURE
        }
    }
}
