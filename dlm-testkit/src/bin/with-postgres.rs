//! Runs a command against a fresh PostgreSQL server on a free 127.0.0.1 port, then stops
//! it.
//!
//! ```text
//! with-postgres COMMAND [ARGS...]
//! ```
//! Every `{url}` in the arguments is replaced by the server's URL. The exit status is the
//! command's.

use std::process::{Command, ExitCode};

use dlm_testkit::postgres::PostgresServer;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: with-postgres COMMAND [ARGS...]");
        return ExitCode::from(2);
    };
    let server = PostgresServer::spawn();
    let url = server.url();
    let status = Command::new(&program)
        .args(args.map(|a| a.replace("{url}", &url)))
        .status();
    drop(server);
    match status {
        Ok(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(0, 255) as u8)),
        Err(e) => {
            eprintln!("with-postgres: cannot run {program}: {e}");
            ExitCode::from(2)
        }
    }
}
