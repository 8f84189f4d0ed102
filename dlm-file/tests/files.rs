//! What a directory holds: a released name leaves no file; a name released again and
//! again keeps its file (its next hold opens it instead of making it), which is removed
//! once the name has gone unused for a second, or when the backend is dropped.

use std::path::Path;
use std::time::{Duration, Instant};

use dlm_core::{Lock, LockClient};
use dlm_file::FileBackend;

fn lock_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("m."))
        .collect();
    names.sort();
    names
}

#[test]
fn names_used_once_leave_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let client = LockClient::new(FileBackend::new(&dir).unwrap());
    for i in 0..100 {
        let guard = client
            .get_lock(&format!("order-{i}"))
            .unwrap()
            .lock()
            .unwrap();
        guard.unlock().unwrap();
    }
    assert!(lock_files(&dir).is_empty(), "{:?}", lock_files(&dir));
}

#[test]
fn a_hot_names_file_is_kept_then_removed_once_idle() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let backend = FileBackend::new(&dir).unwrap();
    let client = LockClient::new(backend.clone());
    let lock = client.get_lock("hot").unwrap();
    for _ in 0..3 {
        lock.lock().unwrap().unlock().unwrap();
    }
    let released = Instant::now();
    assert_eq!(
        lock_files(&dir),
        vec!["m.hot".to_owned()],
        "kept for the next hold"
    );
    // Another backend (another process) takes the kept file and holds it: the first
    // backend's sweep leaves a held file alone.
    let other = LockClient::new(FileBackend::new(&dir).unwrap());
    let held = other.get_lock("hot").unwrap().lock().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        lock_files(&dir),
        vec!["m.hot".to_owned()],
        "a held file was removed"
    );
    drop(held); // its first release there: removed at once
    assert!(lock_files(&dir).is_empty());
    // Kept again by the first backend, and removed by it once unused for a second.
    for _ in 0..3 {
        lock.lock().unwrap().unlock().unwrap();
    }
    let released = Instant::now().max(released);
    // Removed by the lease thread once unused for a second (bounded wait for it).
    while !lock_files(&dir).is_empty() {
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "a kept file was never removed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        released.elapsed() >= Duration::from_millis(500),
        "removed while still hot"
    );
    // And taken again from nothing.
    lock.lock().unwrap().unlock().unwrap();
}

#[test]
fn dropping_the_backend_removes_its_kept_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    {
        let client = LockClient::new(FileBackend::new(&dir).unwrap());
        let lock = client.get_lock("hot").unwrap();
        for _ in 0..3 {
            lock.lock().unwrap().unlock().unwrap();
        }
        assert_eq!(lock_files(&dir), vec!["m.hot".to_owned()]);
    }
    // The client's threads let go of the backend as they end, just after the drop.
    let dropped = Instant::now();
    while !lock_files(&dir).is_empty() {
        assert!(
            dropped.elapsed() < Duration::from_millis(900),
            "the kept file outlived its backend: {:?}",
            lock_files(&dir)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
