//! The real `dlm` binary with `--local`: locks between the processes of this machine, in a
//! directory, with no server.

mod common;

use common::{dlm, q, read, run};

/// 4 processes run `dlm run --dir DIR` 5 times each on one lock: the critical sections
/// never interleave in the file they append to, and their tokens strictly increase.
#[test]
fn local_runs_exclude_each_other_and_get_increasing_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let log = tmp.path().join("log");
    let script = format!(
        "echo \"start $ID\" >> {f}; echo \"token $ID $DLM_FENCING_TOKEN\" >> {f}; \
         sleep 0.02; echo \"end $ID\" >> {f}",
        f = q(&log)
    );
    std::thread::scope(|s| {
        for p in 0..4 {
            let (script, dir) = (&script, &dir);
            s.spawn(move || {
                for i in 0..5 {
                    run(dlm()
                        .args(["run", "--dir"])
                        .arg(dir)
                        .args(["mutex", "-c", script])
                        .env("ID", format!("{p}.{i}")))
                    .expect(0);
                }
            });
        }
    });
    let text = read(&log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 60, "{text}");
    let mut last = 0u64;
    for section in lines.chunks(3) {
        let id = section[0].strip_prefix("start ").expect("a start");
        assert!(
            section[1].starts_with(&format!("token {id} ")),
            "interleaved:\n{text}"
        );
        assert_eq!(section[2], format!("end {id}"), "interleaved:\n{text}");
        let token: u64 = section[1].rsplit(' ').next().unwrap().parse().unwrap();
        assert!(token > last, "token {token} after {last}:\n{text}");
        last = token;
    }
}

#[test]
fn a_held_local_lock_is_refused_status_shows_it_and_force_unlock_frees_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let d = q(&dir);
    let bin = env!("CARGO_BIN_EXE_dlm");
    // Inside the holder's command: another run fails at once (1, or -E's), status shows
    // the lock held, and the forced release frees it.
    let inner = format!(
        "{bin} run --dir {d} -n job -- true; echo refused=$?; \
         {bin} run --dir {d} -n -E 75 job -- true; echo refused_e=$?; \
         {bin} status --dir {d} job; \
         {bin} unlock --force --dir {d} job </dev/null; echo unlocked=$?; \
         {bin} run --dir {d} -n job -- true; echo after=$?"
    );
    let done = run(dlm()
        .args(["run", "--dir"])
        .arg(&dir)
        .args(["job", "-c", &inner]));
    // The holder's lock was released by force under it: it says so, with 70.
    done.expect(70);
    assert!(
        done.stderr.contains("the lock had been lost"),
        "{}",
        done.stderr
    );
    let out = &done.stdout;
    assert!(out.contains("refused=1"), "{out}");
    assert!(out.contains("refused_e=75"), "{out}");
    assert!(out.contains("job\theld\t"), "{out}");
    assert!(out.contains("unlocked=0"), "{out}");
    assert!(out.contains("after=0"), "{out}");
    let free = run(dlm().args(["status", "--dir"]).arg(&dir).arg("job"));
    free.expect(0);
    assert_eq!(free.stdout.trim(), "job\tfree");
}

#[test]
fn no_backend_is_a_usage_error_that_names_local() {
    let done = run(dlm().args(["run", "-n", "job", "--", "true"]));
    done.expect(64);
    assert!(
        done.stderr
            .contains("--local for a lock on this machine only"),
        "{}",
        done.stderr
    );
}

#[test]
fn local_refuses_server_options_and_other_backends() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        vec!["--local", "--redis", "redis://127.0.0.1:1"],
        vec!["--local", "--prefix", "x"],
        vec!["--local", "--cluster"],
        vec!["--local", "--tls-ca-file", "/etc/hosts"],
    ] {
        let done = run(dlm()
            .arg("run")
            .args(&args)
            .arg("--dir")
            .arg(tmp.path().join("d"))
            .args(["job", "--", "true"]));
        done.expect(64);
        assert!(
            done.stderr.contains("cannot be used with"),
            "{args:?}: {}",
            done.stderr
        );
    }
}

/// Semaphores, read-write locks and elections with no server: inside a holder of one of 2
/// permits, a second holder runs and a third is refused, `status` shows both holders with
/// their labels, and another count is a conflict (78); inside a reader, another reader
/// runs and a writer is refused; inside a leader, `dlm leader` shows its value.
#[test]
fn local_semaphores_read_write_locks_and_elections_work_and_show_their_holders() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let d = q(&dir);
    let bin = env!("CARGO_BIN_EXE_dlm");
    let third = format!(
        "{bin} run --dir {d} --permits 2 -n jobs -- true; echo third=$?; \
         {bin} status --dir {d} --permits 2 jobs"
    );
    let inner = format!(
        "{bin} run --dir {d} --permits 2 -n jobs -- true; echo second=$?; \
         {bin} run --dir {d} --permits 2 --label inner -n jobs -c {third}; \
         {bin} run --dir {d} --permits 3 -n jobs -- true; echo conflict=$?",
        third = q(std::path::Path::new(&third))
    );
    let done = run(dlm().args(["run", "--dir"]).arg(&dir).args([
        "--permits",
        "2",
        "--label",
        "outer",
        "jobs",
        "-c",
        &inner,
    ]));
    done.expect(0);
    let out = &done.stdout;
    assert!(out.contains("second=0"), "{out}");
    assert!(out.contains("third=1"), "{out}");
    assert!(out.contains("conflict=78"), "{out}\n{}", done.stderr);
    assert!(out.contains("outer") && out.contains("inner"), "{out}");

    let inner = format!(
        "{bin} run --dir {d} --shared -n data -- true; echo reader=$?; \
         {bin} run --dir {d} --exclusive -n data -- true; echo writer=$?"
    );
    let done = run(dlm()
        .args(["run", "--dir"])
        .arg(&dir)
        .args(["--shared", "data", "-c", &inner]));
    done.expect(0);
    assert!(done.stdout.contains("reader=0"), "{}", done.stdout);
    assert!(done.stdout.contains("writer=1"), "{}", done.stdout);
    // An election: the leader's value is seen by `dlm leader`, and nobody leads after.
    let inner = format!("{bin} leader --dir {d} svc; echo leader=$?");
    let done = run(dlm()
        .args(["run", "--dir"])
        .arg(&dir)
        .args(["--elect", "--value", "host-a", "svc", "-c", &inner]));
    done.expect(0);
    assert!(done.stdout.contains("host-a\t"), "{}", done.stdout);
    assert!(done.stdout.contains("leader=0"), "{}", done.stdout);
    run(dlm().args(["leader", "--dir"]).arg(&dir).arg("svc")).expect(1);
    let free = run(dlm()
        .args(["status", "--dir"])
        .arg(&dir)
        .args(["--permits", "2", "jobs"]));
    free.expect(0);
    assert!(free.stdout.contains("free"), "{}", free.stdout);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| !f.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "lock files left: {left:?}");
}

#[test]
fn dlm_dir_alone_names_the_local_backend_and_the_default_is_the_runtime_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("env-locks");
    let done = run(dlm()
        .env("DLM_DIR", &dir)
        .args([
            "run",
            "job",
            "--",
            "sh",
            "-c",
            "ls \"$DLM_DIR_SEEN\" >/dev/null; true",
        ])
        .env("DLM_DIR_SEEN", &dir));
    done.expect(0);
    assert!(dir.is_dir(), "DLM_DIR was not used");
    // With $XDG_RUNTIME_DIR, --local's default is $XDG_RUNTIME_DIR/dlm.
    let runtime = tmp.path().join("run");
    std::fs::create_dir(&runtime).unwrap();
    let done = run(dlm().env("XDG_RUNTIME_DIR", &runtime).args([
        "run",
        "--local",
        "job",
        "--",
        "sh",
        "-c",
        "test -e \"$XDG_RUNTIME_DIR/dlm/m.job\"",
    ]));
    done.expect(0);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(runtime.join("dlm")).unwrap().mode() & 0o777,
        0o700
    );
    // Beside a server's variable, DLM_DIR is ambiguous: refused.
    let done = run(dlm()
        .env("DLM_DIR", &dir)
        .env("DLM_REDIS_URL", "redis://127.0.0.1:1")
        .args(["run", "job", "--", "true"]));
    done.expect(64);
}
