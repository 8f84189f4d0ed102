//! `dlm status` and `dlm unlock --force`.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;

use crate::BackendArgs;
use crate::backend::Connection;
use crate::exit::{self, Failure};
use crate::run::{Kind, Resource};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The locks' names.
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
    /// One JSON array: `[{"name": ..., "held": true, "remaining_ms": 1234}, ...]`; with
    /// --permits also `"holders"` and `"permits"`, with --rw `"holders"` (`remaining_ms`:
    /// the longest lease among them).
    #[arg(long)]
    json: bool,
    /// The semaphores NAME of N permits (`dlm run --permits N`): how many permits are held,
    /// and the longest remaining lease among them.
    #[arg(long, value_name = "N", value_parser = crate::run::permits, conflicts_with = "shared")]
    permits: Option<u32>,
    /// The read-write locks NAME (`dlm run --shared` / `--exclusive`): how many hold them
    /// (readers, or the writer), and the longest remaining lease among them.
    #[arg(long, visible_alias = "rw")]
    shared: bool,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
}

#[derive(Debug, Args)]
pub(crate) struct UnlockArgs {
    /// The lock's name.
    #[arg(value_name = "NAME")]
    name: String,
    /// Required: releases the lock whoever holds it (the holder is not told, and its
    /// command runs on unless its renewal notices).
    #[arg(long)]
    force: bool,
    /// Do not ask for confirmation on a terminal.
    #[arg(short, long)]
    yes: bool,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
}

pub(crate) fn status(conn: &Connection, args: &StatusArgs) -> Result<u8, Failure> {
    let client = conn
        .client()
        .build()
        .map_err(|e| Failure::from_lock_error("bad settings", &e))?;
    let kind = match (args.permits, args.shared) {
        (Some(n), _) => Kind::Permits(n),
        (None, true) => Kind::Rw,
        (None, false) => Kind::Lock,
    };
    let mut rows = Vec::with_capacity(args.names.len());
    for name in &args.names {
        let checked = dlm_core::LockName::new(name)
            .map_err(|e| Failure::usage(format!("bad lock name {name:?}: {}", e.reason())))?;
        let resource = Resource::new(conn, &client, &checked, kind)?;
        let holders = resource
            .inspect()
            .map_err(|e| Failure::from_lock_error(&format!("cannot read {name:?}"), &e))?;
        rows.push((name, holders));
    }
    let mut out = String::new();
    if args.json {
        out.push('[');
        for (i, (name, holders)) in rows.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str("{\"name\": ");
            json_string(&mut out, name);
            match holders {
                Some((_, r)) => out.push_str(&format!(
                    ", \"held\": true, \"remaining_ms\": {}",
                    r.as_millis()
                )),
                None => out.push_str(", \"held\": false, \"remaining_ms\": null"),
            }
            let n = holders.map_or(0, |(n, _)| n);
            match kind {
                Kind::Lock => {}
                Kind::Permits(permits) => {
                    out.push_str(&format!(", \"holders\": {n}, \"permits\": {permits}"));
                }
                _ => out.push_str(&format!(", \"holders\": {n}")),
            }
            out.push('}');
        }
        out.push_str("]\n");
    } else {
        // NAME, held or free, the (longest) remaining lease, then, for a semaphore or a
        // read-write lock, how many hold it.
        for (name, holders) in &rows {
            let count = |n: u32| match kind {
                Kind::Lock => String::new(),
                Kind::Permits(permits) => format!("\t{n} of {permits} permits"),
                _ => format!("\t{n} holder{}", if n == 1 { "" } else { "s" }),
            };
            match holders {
                Some((n, r)) => out.push_str(&format!(
                    "{name}\theld\t{:.1}s left{}\n",
                    r.as_secs_f64(),
                    count(*n)
                )),
                None => out.push_str(&format!("{name}\tfree{}\n", count(0))),
            }
        }
    }
    print!("{out}");
    Ok(0)
}

pub(crate) fn unlock(conn: &Connection, args: &UnlockArgs) -> Result<u8, Failure> {
    if !args.force {
        return Err(Failure::usage(
            "unlock releases a lock whoever holds it: say --force (the holder is not told)",
        ));
    }
    let client = conn
        .client()
        .build()
        .map_err(|e| Failure::from_lock_error("bad settings", &e))?;
    let lock = client
        .get_lock(&args.name)
        .map_err(|e| Failure::from_lock_error("bad lock name", &e))?;
    if !args.yes && std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprint!(
            "dlm: release {:?} whoever holds it? Its holder is not told. [y/N] ",
            args.name
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            return Err(Failure::new(exit::CONFLICT, "not released"));
        }
    }
    let released = lock
        .force_unlock()
        .map_err(|e| Failure::from_lock_error(&format!("cannot release {:?}", args.name), &e))?;
    if released {
        println!("{}\treleased", args.name);
    } else {
        println!("{}\tfree (was not held)", args.name);
    }
    Ok(0)
}

/// Appends `s` as a JSON string.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
