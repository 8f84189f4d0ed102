//! `dlm status` and `dlm unlock --force`.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;

use dlm_core::backend::Claim;
use dlm_core::{Holder, Holders};

use crate::BackendArgs;
use crate::backend::Connection;
use crate::exit::{self, Failure};
use crate::run::{Kind, Resource};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The locks' names.
    #[arg(value_name = "NAME", required = true)]
    names: Vec<String>,
    /// One JSON array, an object per NAME: `{"name", "held", "remaining_ms"}` (the longest
    /// lease among the holders); with --permits or --rw also `"holders"` (how many),
    /// `"held_by"` (each hold: `"hold"` permit, read or write, `"label"`, `"remaining_ms"`),
    /// and with --permits `"permits"` (the count given) and `"held_with"` (the count the
    /// holders hold it with, null when free).
    #[arg(long)]
    json: bool,
    /// The semaphores NAME (`dlm run --permits N`): how many permits are held, the count
    /// they are held with (said when it is not N), and who holds each for how long.
    #[arg(long, value_name = "N", value_parser = crate::run::permits, conflicts_with = "shared")]
    permits: Option<u32>,
    /// The read-write locks NAME (`dlm run --shared` / `--exclusive`): who holds them
    /// (readers, or the writer), each for how long.
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
    /// Required: releases it whoever holds it (the holders are not told, and their
    /// commands run on until their renewal notices).
    #[arg(long)]
    force: bool,
    /// The semaphore NAME instead of the lock NAME: every permit (the count, if given as
    /// --permits=N, changes nothing).
    #[arg(long, value_name = "N", num_args = 0..=1, require_equals = true, default_missing_value = "1",
          value_parser = crate::run::permits, conflicts_with = "rw")]
    permits: Option<u32>,
    /// The read-write lock NAME instead of the lock NAME: every read and write hold, and a
    /// waiting writer's mark.
    #[arg(long, visible_alias = "shared")]
    rw: bool,
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
        let holders = resource.inspect().map_err(|e| {
            Failure::from_lock_error(&format!("cannot read {name:?} ({})", conn.describe), &e)
        })?;
        rows.push((name, holders));
    }
    let out = if args.json {
        json(&rows, kind)
    } else {
        text(&rows, kind)
    };
    print!("{out}");
    Ok(0)
}

/// The kind of a hold, as shown.
fn hold_name(h: &Holder) -> &'static str {
    match h.claim {
        Claim::Permit { .. } => "permit",
        Claim::Read => "read",
        Claim::Write => "write",
        _ => "lock",
    }
}

/// NAME, held or free, the (longest) remaining lease; for a semaphore or a read-write lock
/// how many hold it, then one line per hold: its kind, its label, its lease.
fn text(rows: &[(&String, Holders)], kind: Kind) -> String {
    let mut out = String::new();
    for (name, holders) in rows {
        let n = holders.holders.len();
        let count = match kind {
            Kind::Lock => String::new(),
            Kind::Permits(asked) => match holders.permits {
                Some(with) if with != asked => format!(
                    "\t{n} of {with} permits (held with {with}, not {asked}: --permits {asked} is refused while it is)"
                ),
                _ => format!("\t{n} of {asked} permits"),
            },
            _ => format!("\t{n} holder{}", if n == 1 { "" } else { "s" }),
        };
        if holders.is_free() {
            out.push_str(&format!("{name}\tfree{count}\n"));
            continue;
        }
        out.push_str(&format!(
            "{name}\theld\t{:.1}s left{count}\n",
            holders.longest().as_secs_f64()
        ));
        if kind == Kind::Lock {
            continue;
        }
        let mut list: Vec<&Holder> = holders.holders.iter().collect();
        list.sort_by_key(|h| std::cmp::Reverse(h.remaining));
        for h in list {
            out.push_str(&format!(
                "  {}\t{}\t{:.1}s left\n",
                hold_name(h),
                h.label.as_deref().map_or_else(|| "-".to_owned(), printable),
                h.remaining.as_secs_f64()
            ));
        }
    }
    out
}

/// A label as shown on a terminal: control characters escaped (a label written by
/// another client is not trusted to be printable).
fn printable(label: &str) -> String {
    label.escape_debug().to_string()
}

fn json(rows: &[(&String, Holders)], kind: Kind) -> String {
    let mut out = String::from("[");
    for (i, (name, holders)) in rows.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str("{\"name\": ");
        json_string(&mut out, name);
        if holders.is_free() {
            out.push_str(", \"held\": false, \"remaining_ms\": null");
        } else {
            out.push_str(&format!(
                ", \"held\": true, \"remaining_ms\": {}",
                holders.longest().as_millis()
            ));
        }
        if kind == Kind::Lock {
            out.push('}');
            continue;
        }
        out.push_str(&format!(", \"holders\": {}", holders.holders.len()));
        if let Kind::Permits(asked) = kind {
            let with = holders
                .permits
                .map_or_else(|| "null".to_owned(), |p| p.to_string());
            out.push_str(&format!(", \"permits\": {asked}, \"held_with\": {with}"));
        }
        out.push_str(", \"held_by\": [");
        for (j, h) in holders.holders.iter().enumerate() {
            if j > 0 {
                out.push_str(", ");
            }
            out.push_str(&format!("{{\"hold\": \"{}\", \"label\": ", hold_name(h)));
            match &h.label {
                Some(label) => json_string(&mut out, label),
                None => out.push_str("null"),
            }
            out.push_str(&format!(
                ", \"remaining_ms\": {}}}",
                h.remaining.as_millis()
            ));
        }
        out.push_str("]}");
    }
    out.push_str("]\n");
    out
}

pub(crate) fn unlock(conn: &Connection, args: &UnlockArgs) -> Result<u8, Failure> {
    let what = match (args.permits, args.rw) {
        (Some(_), _) => "semaphore",
        (None, true) => "read-write lock",
        (None, false) => "lock",
    };
    if !args.force {
        return Err(Failure::usage(format!(
            "unlock releases a {what} whoever holds it: say --force (the holders are not told)"
        )));
    }
    let name = dlm_core::LockName::new(&args.name)
        .map_err(|e| Failure::usage(format!("bad lock name: {}", e.reason())))?;
    let client = conn
        .client()
        .build()
        .map_err(|e| Failure::from_lock_error("bad settings", &e))?;
    let kind = match (args.permits, args.rw) {
        (Some(n), _) => Kind::Permits(n),
        (None, true) => Kind::Rw,
        (None, false) => Kind::Lock,
    };
    let resource = Resource::new(conn, &client, &name, kind)?;
    if !args.yes && std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprint!(
            "dlm: release the {what} {:?} whoever holds it? Its holders are not told. [y/N] ",
            args.name
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            return Err(Failure::new(exit::CONFLICT, "not released"));
        }
    }
    let released = resource.force_unlock().map_err(|e| {
        Failure::from_lock_error(
            &format!("cannot release {:?} ({})", args.name, conn.describe),
            &e,
        )
    })?;
    if released {
        println!("{}\treleased", args.name);
    } else {
        println!("{}\tfree (was not held)", args.name);
    }
    Ok(0)
}

/// Appends `s` as a JSON string.
pub(crate) fn json_string(out: &mut String, s: &str) {
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
