//! Bad input and hostile set-ups: each a typed error before anything is created in the
//! directory or any link is followed.

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;

use dlm_core::backend::BackendErrorKind;
use dlm_core::{Error, Lock, LockClient};
use dlm_file::FileBackend;

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn invalid_dir(result: Result<FileBackend, Error>, says: &str) {
    match result {
        Err(Error::InvalidArgument(e)) => {
            assert!(e.to_string().contains(says), "{e} does not say {says:?}")
        }
        other => panic!("expected an InvalidArgument saying {says:?}, got {other:?}"),
    }
}

#[test]
fn a_missing_directory_is_made_private() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("a/b/locks");
    let backend = FileBackend::new(&dir).unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
    assert!(entries(&dir).is_empty(), "nothing is made inside it");
    let guard = LockClient::new(backend)
        .get_lock("job")
        .unwrap()
        .lock()
        .unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("m.job")).unwrap().mode() & 0o777,
        0o600
    );
    drop(guard);
    assert!(entries(&dir).is_empty(), "a released lock leaves no file");
}

#[test]
fn a_group_shared_directory_is_made_for_its_group() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shared");
    let backend = FileBackend::builder(&dir)
        .group_shared(true)
        .build()
        .unwrap();
    assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o770);
    let _guard = LockClient::new(backend)
        .get_lock("job")
        .unwrap()
        .lock()
        .unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("m.job")).unwrap().mode() & 0o777,
        0o660,
        "a group-shared directory's lock files are the group's too"
    );
}

#[test]
fn a_file_at_the_directorys_path_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("locks");
    std::fs::write(&path, b"not a directory").unwrap();
    invalid_dir(FileBackend::new(&path), "is not a directory");
    assert_eq!(std::fs::read(&path).unwrap(), b"not a directory");
}

#[test]
fn a_symbolic_link_as_the_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    let link = tmp.path().join("link");
    symlink(&real, &link).unwrap();
    invalid_dir(FileBackend::new(&link), "symbolic link");
    assert!(entries(&real).is_empty());
}

#[test]
fn a_directory_writable_by_others_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("open");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    invalid_dir(FileBackend::new(&dir), "writable by every user");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    invalid_dir(FileBackend::new(&dir), "writable by its group");
    FileBackend::builder(&dir)
        .group_shared(true)
        .build()
        .unwrap();
    assert!(entries(&dir).is_empty());
}

#[test]
fn a_directory_owned_by_another_user_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("theirs");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let me = std::fs::metadata(tmp.path()).unwrap().uid();
    let dir = if me == 0 {
        // As root: give it away.
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
        dir
    } else {
        // As anyone else: the root directory is another user's.
        Path::new("/").to_owned()
    };
    invalid_dir(FileBackend::new(&dir), "is owned by uid");
}

#[test]
fn a_directory_that_cannot_be_written_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ro");
    std::fs::create_dir(&dir).unwrap();
    let root = std::fs::metadata(tmp.path()).unwrap().uid() == 0;
    let mounted = if root {
        // Root may write any directory it can search: a read-only file system stops it.
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "ro,size=64k,mode=0700", "tmpfs"])
            .arg(&dir)
            .status()
            .expect("mount(8)");
        assert!(
            status.success(),
            "mounting a read-only tmpfs failed: {status}"
        );
        true
    } else {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o500)).unwrap();
        false
    };
    let result = FileBackend::new(&dir);
    if mounted {
        let status = std::process::Command::new("umount")
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success());
    }
    match result {
        Err(Error::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::Permission, "{e}");
            assert!(e.to_string().contains("cannot create lock files"), "{e}");
        }
        other => panic!("expected a Permission error, got {other:?}"),
    }
}

#[test]
fn names_that_are_not_one_file_name_are_refused_before_any_io() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let client = LockClient::new(FileBackend::new(&dir).unwrap());
    for bad in ["a/b", "../escape", "..", ".", "/abs", &"x".repeat(243)] {
        match client.get_lock(bad) {
            Err(Error::InvalidArgument(e)) => assert!(
                e.to_string().contains("name"),
                "{bad:?}: {e} does not name the argument"
            ),
            other => panic!("{bad:?}: expected InvalidArgument, got {other:?}"),
        }
        assert!(client.get_multi_lock([bad, "ok"]).is_err());
    }
    assert!(entries(&dir).is_empty(), "nothing was created");
    assert!(!tmp.path().join("escape").exists());
    // A semaphore larger than the backend keeps is refused before any I/O as well.
    match client.get_semaphore("ok", 1025) {
        Err(Error::InvalidArgument(e)) => assert!(e.to_string().contains("1024"), "{e}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(entries(&dir).is_empty(), "nothing was created");
    // The longest name that fits a file name, with a semaphore slot's suffix, works for
    // every kind of hold.
    let longest = "y".repeat(242);
    drop(client.get_lock(&longest).unwrap().lock().unwrap());
    drop(
        client
            .get_semaphore(&longest, 1024)
            .unwrap()
            .acquire()
            .unwrap(),
    );
    let rw = client.get_rw_lock(&longest).unwrap();
    drop(rw.read().unwrap());
    drop(rw.write().unwrap());
    assert!(
        entries(&dir).is_empty(),
        "released holds left files: {:?}",
        entries(&dir)
    );
}

#[test]
fn a_symbolic_link_planted_at_a_lock_files_path_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("locks");
    let backend = FileBackend::new(&dir).unwrap();
    let target = tmp.path().join("precious");
    std::fs::write(&target, b"keep me").unwrap();
    symlink(&target, dir.join("m.job")).unwrap();
    let client = LockClient::new(backend);
    match client.get_lock("job").unwrap().try_lock() {
        Err(Error::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::UnexpectedKey, "{e}");
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
    assert!(
        std::fs::symlink_metadata(dir.join("m.job"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link is left for its owner to see"
    );
}

#[test]
fn a_lock_file_made_by_another_user_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    assert_eq!(
        std::fs::metadata(tmp.path()).unwrap().uid(),
        0,
        "this test needs root, to make a file owned by another user (CI runs as root)"
    );
    let dir = tmp.path().join("locks");
    let backend = FileBackend::new(&dir).unwrap();
    let planted = dir.join("m.job");
    std::fs::write(&planted, b"").unwrap();
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).unwrap();
    match LockClient::new(backend).get_lock("job").unwrap().try_lock() {
        Err(Error::Backend(e)) => {
            assert_eq!(e.kind(), BackendErrorKind::UnexpectedKey, "{e}");
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
