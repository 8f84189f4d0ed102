//! Semaphores and read-write locks against states of their files that other processes
//! leave for a moment: a count file kept by an acquirer passing by, the exclusive
//! moment of a last reader's release. Each state is made here by hand, with the same
//! kernel locks another process would hold.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

use dlm_core::backend::Claim;
use dlm_core::{BackendErrorKind, Error, LockClient};
use dlm_file::FileBackend;
use rustix::fs::{FlockOperation, flock};

fn client(dir: &Path, label: &str) -> LockClient {
    LockClient::builder(FileBackend::new(dir).unwrap())
        .label(label)
        .build()
        .unwrap()
}

/// A file of the lock directory, made (0600, this user) and locked by hand as another
/// process would.
fn locked(dir: &Path, file: &str, contents: &[u8], op: FlockOperation) -> File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::write(dir.join(file), contents).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .mode(0o600)
        .open(dir.join(file))
        .unwrap();
    flock(&f, op).unwrap();
    f
}

/// A semaphore's count file says 3 permits, and nobody holds a permit, but another
/// acquirer's shared lock keeps the count from being rewritten: an acquisition with 5
/// permits is refused for now, not failed with a conflict, and gets in once that lock is
/// gone. With a permit held under 3, 5 is a conflict.
#[test]
fn a_count_nobody_holds_any_more_is_not_a_conflict() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let a = client(&dir, "a");
    let passing = locked(
        &dir,
        "s.jobs",
        &3u32.to_le_bytes(),
        FlockOperation::LockShared,
    );
    let five = a.get_semaphore("jobs", 5).unwrap();
    assert!(
        five.try_acquire().unwrap().is_none(),
        "refused while the passing lock keeps the old count"
    );
    drop(passing);
    let permit = five
        .try_acquire_timeout(Duration::from_secs(5))
        .unwrap()
        .expect("the count is rewritten once nobody holds the file");
    drop(permit);

    // The negative control: a permit really held under 3.
    let three = client(&dir, "b").get_semaphore("jobs", 3).unwrap();
    let held = three.acquire().unwrap();
    match five.try_acquire() {
        Err(Error::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::Conflict, "{e}");
            assert!(e.to_string().contains("jobs"), "{e}");
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    drop(held);
}

/// A last reader's release holds `r.NAME` exclusively for a moment (to remove it), and a
/// writer whose process died left its writer file with a record whose lease has not run
/// out: an inspection then reports no writer, since nobody holds the writer file. A real
/// writer is reported, with its label.
#[test]
fn a_last_readers_moment_is_not_a_phantom_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let c = client(&dir, "w-label");
    let rw = c.get_rw_lock("data").unwrap();
    // The dead writer's record: a lease end far ahead, token 7, label "dead".
    let mut record = (i64::MAX / 2).to_le_bytes().to_vec();
    record.extend_from_slice(&7u64.to_le_bytes());
    record.extend_from_slice(&4u16.to_le_bytes());
    record.extend_from_slice(b"dead");
    drop(locked(&dir, "x.data", &record, FlockOperation::LockShared));
    let moment = locked(&dir, "r.data", b"", FlockOperation::LockExclusive);
    assert!(rw.inspect().unwrap().is_free(), "{:?}", rw.inspect());
    drop(moment);
    std::fs::remove_file(dir.join("r.data")).unwrap();

    let other = client(&dir, "other").get_rw_lock("data").unwrap();
    let w = other.write().unwrap();
    let holders = rw.inspect().unwrap();
    assert_eq!(holders.holders.len(), 1, "{holders:?}");
    assert_eq!(holders.holders[0].claim, Claim::Write);
    assert_eq!(holders.holders[0].label.as_deref(), Some("other"));
    drop(w);
    assert!(rw.inspect().unwrap().is_free());
}
