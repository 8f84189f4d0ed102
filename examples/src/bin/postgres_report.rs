//! A batch job on PostgreSQL: the lock and the job's result in the same database, the
//! result written only with a fencing token larger than the last one that wrote it.
//!
//! ```text
//! cargo run -p dlm-examples --bin postgres_report -- --postgres postgresql://USER@HOST/DB
//! ```
//! Two workers of the nightly report: worker 1 takes the lock and stalls (a GC pause, a
//! swapped-out process) past its lease; worker 2 takes the lock, computes the report and
//! writes it; worker 1 wakes and writes its stale report as if it still held the lock.
//! The write is one statement, `UPDATE report SET ... WHERE day = $1 AND fence < $2`:
//! worker 1's smaller token changes no row. The exit status is 0 when the stale write
//! was refused.

use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use dlm_core::{FencingToken, Lock, LockClient};
use dlm_examples::Args;
use dlm_postgres::PostgresBackend;

/// Writes the day's report with `token`: whether the row changed (a stale token changes
/// nothing).
fn write_report(
    db: &mut postgres::Client,
    day: &str,
    token: FencingToken,
    body: &str,
) -> Result<bool, postgres::Error> {
    // The token is a u64; PostgreSQL's bigint is signed: dlm's tokens fit it.
    let fence = i64::try_from(token.get()).expect("a token that fits a bigint");
    let changed = db.execute(
        "UPDATE dlm_example_report SET body = $3, fence = $2 WHERE day = $1 AND fence < $2",
        &[&day, &fence, &body],
    )?;
    Ok(changed == 1)
}

fn main() -> ExitCode {
    let mut args = Args::from_env("postgres_report", "--postgres URL");
    let url = args
        .value("--postgres")
        .unwrap_or_else(|| args.fail("--postgres URL is required"));
    args.finish();
    let mut db = postgres::Client::connect(&url, postgres::NoTls)
        .unwrap_or_else(|e| args.fail(&format!("cannot connect to {url}: {e}")));
    let day = format!("2026-11-28/{}", std::process::id());
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS dlm_example_report \
         (day text PRIMARY KEY, fence bigint NOT NULL, body text)",
    )
    .expect("create the report table");
    db.execute(
        "INSERT INTO dlm_example_report VALUES ($1, 0, NULL) ON CONFLICT DO NOTHING",
        &[&day],
    )
    .expect("the day's row");

    let backend = PostgresBackend::new(&url).unwrap_or_else(|e| args.fail(&e.to_string()));
    let backend = std::sync::Arc::new(backend);
    let lease = Duration::from_millis(500);
    let worker1 = LockClient::builder(backend.clone())
        .lease(lease)
        .build()
        .unwrap();
    let worker2 = LockClient::builder(backend).build().unwrap();
    let name = format!("nightly-report/{day}");

    let g1 = worker1
        .get_lock(&name)
        .unwrap()
        .lock()
        .expect("worker 1 locks");
    let t1 = g1.fencing_token().expect("a token");
    println!(
        "worker 1: took the lock with token {t1}, lease {lease:?}; stalls for {:?}",
        lease * 3
    );
    let stall = thread::spawn(move || thread::sleep(lease * 3));

    let g2 = worker2
        .get_lock(&name)
        .unwrap()
        .try_lock_timeout(Duration::from_secs(10))
        .expect("worker 2 locks")
        .expect("worker 1's lease ran out");
    let t2 = g2.fencing_token().expect("a token");
    let written = write_report(&mut db, &day, t2, "report by worker 2").expect("worker 2 writes");
    println!("worker 2: took the lock with token {t2}, wrote the report: {written}");
    g2.unlock().expect("worker 2 unlocks");
    if !written {
        println!("worker 2's write was refused: the example failed");
        return ExitCode::FAILURE;
    }

    stall.join().unwrap();
    println!(
        "worker 1: wakes; its guard says is_held={} (it should check; suppose it does not)",
        g1.is_held()
    );
    let stale =
        write_report(&mut db, &day, t1, "stale report by worker 1").expect("the write runs");
    let body: Option<String> = db
        .query_one(
            "SELECT body FROM dlm_example_report WHERE day = $1",
            &[&day],
        )
        .expect("read the report")
        .get(0);
    db.execute("DELETE FROM dlm_example_report WHERE day = $1", &[&day])
        .expect("clean up");
    println!("the report now: {body:?}");
    if stale {
        println!("worker 1: wrote with token {t1}: accepted (fencing failed!)");
        ExitCode::FAILURE
    } else {
        println!("worker 1: wrote with token {t1}: refused (0 rows changed)");
        println!("stale write refused");
        ExitCode::SUCCESS
    }
}
