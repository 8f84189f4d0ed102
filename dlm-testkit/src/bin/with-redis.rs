//! Runs a command against N fresh redis-server processes on free 127.0.0.1 ports, then
//! stops them.
//!
//! ```text
//! with-redis N COMMAND [ARGS...]
//! ```
//! Every `{urls}` in the arguments is replaced by the servers' URLs, comma-separated. The
//! exit status is the command's.

use std::process::{Command, ExitCode};

use dlm_testkit::redis_server::RedisNodes;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let usage = "usage: with-redis N COMMAND [ARGS...]";
    let Some(n) = args
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0)
    else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let Some(program) = args.next() else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let nodes = RedisNodes::spawn(n);
    let urls = nodes.urls().join(",");
    let status = Command::new(&program)
        .args(args.map(|a| a.replace("{urls}", &urls)))
        .status();
    drop(nodes);
    match status {
        Ok(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(0, 255) as u8)),
        Err(e) => {
            eprintln!("with-redis: cannot run {program}: {e}");
            ExitCode::from(2)
        }
    }
}
