//! `dlm leader`: who leads the election NAME, once or at every change.

use std::io::Write;

use clap::Args;

use dlm_core::Leader;

use crate::BackendArgs;
use crate::backend::Connection;
use crate::exit::{self, Failure};
use crate::status::json_string;

#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    /// The election's name (`dlm run --elect NAME`).
    #[arg(value_name = "NAME")]
    name: String,
    /// Print a line at every change (a new leader, a new value, nobody), starting with the
    /// current one, until interrupted. Woken by the store's notifications, not polling.
    #[arg(long)]
    watch: bool,
    /// One JSON object per line: `{"name", "leader"` (the value, null when nobody leads),
    /// `"term"` (null when nobody leads), `"remaining_ms"}`.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
}

/// Prints the leader (`VALUE<TAB>TERM`); exit status 1 when nobody leads. With --watch, a
/// line per change (`-` when nobody leads), until a signal ends dlm.
pub(crate) fn leader(conn: &Connection, args: &LeaderArgs) -> Result<u8, Failure> {
    let client = conn
        .client()
        .build()
        .map_err(|e| Failure::from_lock_error("bad settings", &e))?;
    let election = client.get_election(&args.name).map_err(|e| {
        if e.backend_kind() == Some(dlm_core::BackendErrorKind::Unsupported) {
            Failure::usage(format!(
                "{} keeps no elections; they need one Redis server (with fencing), --sentinel, --cluster, --etcd or --postgres",
                conn.describe
            ))
        } else {
            Failure::from_lock_error("bad election name", &e)
        }
    })?;
    let cannot = |e: dlm_core::Error| {
        Failure::from_lock_error(
            &format!("cannot read {:?} ({})", args.name, conn.describe),
            &e,
        )
    };
    if !args.watch {
        let now = election.leader().map_err(cannot)?;
        if now.is_some() || args.json {
            print!("{}", line(&args.name, now.as_ref(), args.json));
        }
        return Ok(if now.is_some() { 0 } else { exit::CONFLICT });
    }
    let mut out = std::io::stdout();
    for change in election.observe() {
        match change {
            Ok(now) => {
                // A reader that went away ends the watch.
                if out
                    .write_all(line(&args.name, now.as_ref(), args.json).as_bytes())
                    .and_then(|()| out.flush())
                    .is_err()
                {
                    return Ok(0);
                }
            }
            Err(e) => {
                log::warn!(
                    "cannot read {:?} ({}; looking again): {e}",
                    args.name,
                    conn.describe
                );
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
    Ok(0)
}

/// One line: the leader's value and term, or `-` (text); the JSON object (--json). Only
/// with --json or --watch does a vacant election print anything.
fn line(name: &str, leader: Option<&Leader>, json: bool) -> String {
    if json {
        let mut out = String::from("{\"name\": ");
        json_string(&mut out, name);
        out.push_str(", \"leader\": ");
        match leader.and_then(Leader::value) {
            Some(v) => json_string(&mut out, v),
            None => out.push_str("null"),
        }
        let term = leader
            .and_then(Leader::term)
            .map_or_else(|| "null".to_owned(), |t| t.get().to_string());
        let remaining = leader.map_or_else(
            || "null".to_owned(),
            |l| l.remaining().as_millis().to_string(),
        );
        out.push_str(&format!(
            ", \"term\": {term}, \"remaining_ms\": {remaining}}}\n"
        ));
        return out;
    }
    match leader {
        Some(l) => format!(
            "{}\t{}\n",
            l.value().unwrap_or(""),
            l.term().map_or_else(String::new, |t| t.get().to_string())
        ),
        None => "-\n".to_owned(),
    }
}
