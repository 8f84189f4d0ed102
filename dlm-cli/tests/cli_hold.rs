//! `dlm hold` from real bash scripts (the real binary against a real redis-server): the
//! lock is held while the script runs other commands, and released when the script
//! closes the pipe (a `coproc`, or `exec 3< <(dlm hold …)`), on SIGTERM and SIGINT, and
//! never after it was lost; a second `dlm hold` fails or waits as its flags say.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Proc, SERIAL, server, try_once};

/// Runs the bash `script` with `$DLM` (the binary under test) and `$URL`; returns its
/// stdout, after asserting that it exited 0.
#[track_caller]
fn bash(script: &str, url: &str) -> String {
    let done = Proc::spawn(
        Command::new("bash")
            .arg("-c")
            .arg(format!("set -u\n{script}"))
            .env("DLM", env!("CARGO_BIN_EXE_dlm"))
            .env("URL", url)
            .env_remove("DLM_REDIS_URL")
            .env_remove("DLM_REDIS_PASSWORD")
            .stdin(Stdio::null()),
    )
    .wait(Duration::from_secs(60));
    done.expect(0);
    done.stdout
}

/// The value of `key=` on its own line of `out`.
#[track_caller]
fn value<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key}= in the script's output:\n{out}"))
}

/// A `coproc`: the script reads the assignments, runs commands while the lock is held (a
/// `dlm run -n` of the same name is refused), closes its end of the pipe, and `wait`
/// returns once the lock is free. The name needs quoting (a `'` and a `$`).
#[test]
fn a_script_holds_the_lock_across_commands_until_it_closes_the_pipe() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let out = bash(
        r#"
        coproc HOLD { exec "$DLM" hold --redis "$URL" 'it'\''s $HOME'; }
        pid=$HOLD_PID
        read -r vars <&"${HOLD[0]}"
        eval "$vars"
        echo "name=$DLM_LOCK_NAME"
        echo "token=$DLM_FENCING_TOKEN"
        echo "lease=$DLM_LEASE_MS"
        "$DLM" run -n --redis "$URL" "$DLM_LOCK_NAME" -- true; echo "run_while_held=$?"
        "$DLM" run -n --redis "$URL" "$DLM_LOCK_NAME" -- true; echo "run_again=$?"
        exec {HOLD[1]}>&-
        wait "$pid"; echo "hold=$?"
        "$DLM" run -n --redis "$URL" "$DLM_LOCK_NAME" -- sh -c 'echo "next_token=$DLM_FENCING_TOKEN"'
        echo "run_after=$?"
        "#,
        &url,
    );
    assert_eq!(value(&out, "name"), "it's $HOME");
    assert_eq!(value(&out, "lease"), "30000");
    assert_eq!(value(&out, "run_while_held"), "1", "{out}");
    assert_eq!(value(&out, "run_again"), "1", "{out}");
    assert_eq!(value(&out, "hold"), "0", "{out}");
    assert_eq!(value(&out, "run_after"), "0", "{out}");
    let token: u64 = value(&out, "token").parse().unwrap();
    let next: u64 = value(&out, "next_token").parse().unwrap();
    assert!(next > token, "{out}");
}

/// `exec 3< <(dlm hold …)`: the script closes fd 3 (the reader of hold's output), and the
/// hold ends: released, status 0.
#[test]
fn closing_a_process_substitution_releases_the_lock() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let out = bash(
        r#"
        exec 3< <("$DLM" hold -n --redis "$URL" procsub </dev/null)
        pid=$!
        read -r vars <&3
        eval "$vars"
        echo "token=$DLM_FENCING_TOKEN"
        "$DLM" run -n --redis "$URL" procsub -- true; echo "run_while_held=$?"
        exec 3<&-
        wait "$pid"; echo "hold=$?"
        "$DLM" run -n --redis "$URL" procsub -- true; echo "run_after=$?"
        "#,
        &url,
    );
    assert!(value(&out, "token").parse::<u64>().is_ok(), "{out}");
    assert_eq!(value(&out, "run_while_held"), "1", "{out}");
    assert_eq!(value(&out, "hold"), "0", "{out}");
    assert_eq!(value(&out, "run_after"), "0", "{out}");
}

/// SIGTERM and SIGINT release the lock: the hold exits with 128+N once it is free.
#[test]
fn sigterm_and_sigint_release_the_lock() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let out = bash(
        r#"
        for sig in TERM INT; do
            coproc HOLD { exec "$DLM" hold --redis "$URL" signalled; }
            pid=$HOLD_PID
            read -r vars <&"${HOLD[0]}"
            "$DLM" run -n --redis "$URL" signalled -- true; echo "${sig}_while_held=$?"
            kill -$sig "$pid"
            wait "$pid"; echo "${sig}_hold=$?"
            "$DLM" run -n --redis "$URL" signalled -- true; echo "${sig}_after=$?"
        done
        "#,
        &url,
    );
    for (sig, code) in [("TERM", "143"), ("INT", "130")] {
        assert_eq!(value(&out, &format!("{sig}_while_held")), "1", "{out}");
        assert_eq!(value(&out, &format!("{sig}_hold")), code, "{out}");
        assert_eq!(value(&out, &format!("{sig}_after")), "0", "{out}");
    }
}

/// A second `dlm hold` of a held name: `-n` fails at once with 1 and prints nothing,
/// `-w 0.3 -E 7` gives up with 7, and one that waits gets the lock (a larger token) once
/// the first hold is released.
#[test]
fn a_second_hold_fails_or_waits_as_its_flags_say() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let out = bash(
        r#"
        coproc HOLD { exec "$DLM" hold --redis "$URL" contended; }
        pid=$HOLD_PID
        read -r vars <&"${HOLD[0]}"
        eval "$vars"
        echo "first=$DLM_FENCING_TOKEN"
        second=$("$DLM" hold -n --redis "$URL" contended </dev/null); echo "no_wait=$?"
        echo "no_wait_output=[$second]"
        "$DLM" hold -w 0.3 -E 7 --redis "$URL" contended </dev/null; echo "wait_short=$?"
        exec 4< <("$DLM" hold -w 30 --redis "$URL" contended </dev/null)
        waiter=$!
        exec {HOLD[1]}>&-
        wait "$pid"; echo "hold=$?"
        read -r vars <&4
        eval "$vars"
        echo "second=$DLM_FENCING_TOKEN"
        "$DLM" run -n --redis "$URL" contended -- true; echo "run_while_second_holds=$?"
        exec 4<&-
        wait "$waiter"; echo "waiter=$?"
        "#,
        &url,
    );
    assert_eq!(value(&out, "no_wait"), "1", "{out}");
    assert_eq!(value(&out, "no_wait_output"), "[]", "{out}");
    assert_eq!(value(&out, "wait_short"), "7", "{out}");
    assert_eq!(value(&out, "hold"), "0", "{out}");
    assert_eq!(value(&out, "run_while_second_holds"), "1", "{out}");
    assert_eq!(value(&out, "waiter"), "0", "{out}");
    let first: u64 = value(&out, "first").parse().unwrap();
    let second: u64 = value(&out, "second").parse().unwrap();
    assert!(second > first, "{out}");
    assert_eq!(try_once(&url, "contended"), 0);
}

/// A fixed lease that runs out while the script still holds the pipe open: the hold
/// exits 70 (lost) by itself, and the lock is free.
#[test]
fn a_lost_lock_ends_the_hold_with_status_70() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let out = bash(
        r#"
        coproc HOLD { exec "$DLM" hold --lease 1 --redis "$URL" short; }
        pid=$HOLD_PID
        read -r vars <&"${HOLD[0]}"
        eval "$vars"
        echo "lease=$DLM_LEASE_MS"
        wait "$pid"; echo "hold=$?"
        "$DLM" run -n --redis "$URL" short -- true; echo "run_after=$?"
        "#,
        &url,
    );
    assert_eq!(value(&out, "lease"), "1000", "{out}");
    assert_eq!(value(&out, "hold"), "70", "{out}");
    assert_eq!(value(&out, "run_after"), "0", "{out}");
}

/// Standard input from `/dev/null` and standard output to a file: neither is watched, so
/// the hold lasts until a signal (it had ended at once, as if its input had ended).
#[test]
fn a_hold_that_watches_nothing_lasts_until_a_signal() {
    let _serial = SERIAL.lock();
    let server = server();
    let url = server.url();
    let mut hold = Proc::spawn(common::dlm().args(["hold", "--redis", &url, "unwatched"]));
    common::wait_until(Duration::from_secs(10), "the assignments", || {
        hold.stdout_now().starts_with("DLM_LOCK_NAME='unwatched'")
    });
    // Held: a second run is refused, and the hold is still running.
    assert_eq!(try_once(&url, "unwatched"), 1);
    assert!(
        hold.stderr_now().is_empty(),
        "the hold said: {}",
        hold.stderr_now()
    );
    hold.signal("TERM");
    hold.wait(Duration::from_secs(30)).expect(143);
    assert_eq!(try_once(&url, "unwatched"), 0);
}
