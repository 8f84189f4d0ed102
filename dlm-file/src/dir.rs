//! The lock directory: made with a safe mode, checked before any lock file is created in
//! it, and the lock files opened without following symbolic links.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use dlm_core::backend::{BackendError, BackendErrorKind, LockName};
use dlm_core::{Error, InvalidArgument};
use rustix::fs::{self, Access, AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

/// File systems whose `flock(2)` is not a local kernel lock: NFS (where it becomes a
/// byte-range lock of the server, lost with a lease the client does not see), SMB/CIFS,
/// FUSE (sshfs and the like decide for themselves), Ceph, AFS, 9p.
const NETWORK_FILE_SYSTEMS: &[(u64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x6573_5546, "FUSE"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x0102_1997, "9p"),
];

/// A file's device and inode: which file a path named when it was opened.
pub(crate) type Identity = (u64, u64);

/// An open lock file and its identity.
pub(crate) type OpenFile = (OwnedFd, Identity);

/// What one attempt at a kernel lock came to ([`Dir::lock`]).
pub(crate) enum Attempted {
    /// Locked, and the file still has its link.
    Locked(OpenFile),
    /// Another open file holds the lock.
    Refused(OpenFile),
    /// The file had lost its link (removed by a release meanwhile): try again.
    Unlinked,
}

/// The prefix of a mutex's lock file (`m.NAME`): lock files never collide with the
/// directory's own files, which start with `.`.
pub(crate) const MUTEX_PREFIX: &str = "m.";

/// The longest file name most Linux file systems take.
const MAX_FILE_NAME: usize = 255;

/// The longest lock name: a file name with room for a two-byte prefix and a slot's
/// suffix (`p.NAME.4294967295`).
pub(crate) const MAX_NAME: usize = MAX_FILE_NAME - 2 - 11;

/// Whether `name` can be a lock file's name in the directory: no `/`, not `.` or `..`,
/// short enough for a file name with its prefix.
pub(crate) fn check_name(name: &LockName) -> Result<(), InvalidArgument> {
    let n = name.as_str();
    if n.contains('/') {
        return Err(InvalidArgument::new(
            "name",
            format!("{n:?} contains '/': a file lock's name is one file name"),
        ));
    }
    if n == "." || n == ".." {
        return Err(InvalidArgument::new(
            "name",
            format!("{n:?} is not a file name"),
        ));
    }
    if n.len() > MAX_NAME {
        return Err(InvalidArgument::new(
            "name",
            format!(
                "{} bytes: a file lock's name is at most {MAX_NAME} bytes (a file name, \
                 with room for a prefix and a semaphore slot's number)",
                n.len(),
            ),
        ));
    }
    Ok(())
}

/// How the directory may be shared.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirOptions {
    /// The directory's group may use it too (mode 0770, files 0660), else 0700 and 0600.
    pub(crate) group_shared: bool,
    /// Accept a directory on a network file system.
    pub(crate) allow_network: bool,
}

/// The open directory, every lock file opened relative to it.
#[derive(Debug)]
pub(crate) struct Dir {
    pub(crate) fd: OwnedFd,
    pub(crate) path: PathBuf,
    /// The mode lock files are created with.
    pub(crate) file_mode: Mode,
    /// Who may own a lock file: this user only, or (group-shared) anyone of the group.
    group_shared: bool,
    /// This process's effective user id (read once: a system call per open otherwise).
    euid: u32,
}

fn invalid(path: &Path, reason: impl std::fmt::Display) -> Error {
    InvalidArgument::new("dir", format!("{}: {reason}", path.display())).into()
}

fn io_error(path: &Path, what: &str, e: Errno) -> BackendError {
    let kind = match e {
        Errno::ACCESS | Errno::PERM | Errno::ROFS => BackendErrorKind::Permission,
        Errno::LOOP => BackendErrorKind::UnexpectedKey,
        _ => BackendErrorKind::Other,
    };
    BackendError::new(kind, format!("{}: {what}: {e}", path.display())).never_sent()
}

impl Dir {
    /// Opens `path`, making it (and its missing parents) first if it does not exist, and
    /// checks it: a directory, not a symbolic link, owned by this user, not writable by
    /// others (nor by its group unless group-shared), writable by us, on a local file
    /// system (unless allowed). Nothing is created inside it.
    pub(crate) fn open(path: &Path, opts: DirOptions) -> Result<Dir, Error> {
        let dir_mode = if opts.group_shared { 0o770 } else { 0o700 };
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match fs::open(path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| invalid(path, format_args!("cannot make its parent: {e}")))?;
                }
                let made = match fs::mkdir(path, Mode::from_raw_mode(dir_mode)) {
                    Ok(()) => true,
                    Err(Errno::EXIST) => false,
                    Err(e) => {
                        return Err(io_error(path, "cannot make the directory", e).into());
                    }
                };
                let fd = fs::open(path, flags, Mode::empty())
                    .map_err(|e| Error::from(io_error(path, "cannot open the directory", e)))?;
                if made {
                    // The umask may have taken bits off (a group-shared directory's g+w).
                    fs::fchmod(&fd, Mode::from_raw_mode(dir_mode))
                        .map_err(|e| Error::from(io_error(path, "chmod", e)))?;
                }
                fd
            }
            Err(Errno::LOOP | Errno::NOTDIR) => {
                let link =
                    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
                return Err(invalid(
                    path,
                    if link {
                        "is a symbolic link: give the directory it points to (links are not followed)"
                    } else {
                        "is not a directory"
                    },
                ));
            }
            Err(e) => return Err(io_error(path, "cannot open the directory", e).into()),
        };
        let st = fs::fstat(&fd).map_err(|e| Error::from(io_error(path, "fstat", e)))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(invalid(path, "is not a directory"));
        }
        let me = rustix::process::geteuid().as_raw();
        if st.st_uid != me {
            return Err(invalid(
                path,
                format_args!(
                    "is owned by uid {}, not by this user (uid {me}): another user could take, \
                     steal or redirect its locks",
                    st.st_uid
                ),
            ));
        }
        let others_write = st.st_mode & 0o002 != 0;
        let group_write = st.st_mode & 0o020 != 0;
        if others_write || (group_write && !opts.group_shared) {
            return Err(invalid(
                path,
                format_args!(
                    "is writable by {} (mode {:o}): they could replace its lock files; \
                     chmod {} it{}",
                    if others_write {
                        "every user"
                    } else {
                        "its group"
                    },
                    st.st_mode & 0o7777,
                    if opts.group_shared { "770" } else { "700" },
                    if opts.group_shared {
                        ""
                    } else {
                        ", or share it with its group on purpose (group_shared)"
                    }
                ),
            ));
        }
        if !opts.allow_network {
            let sfs = fs::fstatfs(&fd).map_err(|e| Error::from(io_error(path, "statfs", e)))?;
            // `f_type`'s width differs between targets.
            #[allow(clippy::unnecessary_cast)]
            let magic = sfs.f_type as u64;
            if let Some((_, fs_name)) = NETWORK_FILE_SYSTEMS.iter().find(|(m, _)| *m == magic) {
                return Err(invalid(
                    path,
                    format_args!(
                        "is on {fs_name}, a network file system, whose flock is not a local \
                         kernel lock (allow_network_fs opts in)"
                    ),
                ));
            }
        }
        if let Err(e) = fs::accessat(
            &fd,
            ".",
            Access::WRITE_OK | Access::EXEC_OK,
            AtFlags::EACCESS,
        ) {
            return Err(io_error(path, "cannot create lock files in it", e).into());
        }
        Ok(Dir {
            fd,
            path: path.to_owned(),
            file_mode: Mode::from_raw_mode(if opts.group_shared { 0o660 } else { 0o600 }),
            group_shared: opts.group_shared,
            euid: rustix::process::geteuid().as_raw(),
        })
    }

    /// Opens (creating it if `create`) the file `file` of the directory for reading and
    /// writing, without following a symbolic link, and checks that it is a regular file
    /// this user may trust. `Ok(None)`: it does not exist and `create` is false.
    pub(crate) fn open_file(
        &self,
        file: &str,
        create: bool,
    ) -> Result<Option<OwnedFd>, BackendError> {
        Ok(self.open_file_with_id(file, create)?.map(|(fd, _)| fd))
    }

    /// [`open_file`](Dir::open_file), with the file's device and inode.
    pub(crate) fn open_file_with_id(
        &self,
        file: &str,
        create: bool,
    ) -> Result<Option<OpenFile>, BackendError> {
        self.open_with(file, create, true)
    }

    /// [`open_file_with_id`](Dir::open_file_with_id), for reading only when `!write`: a
    /// file open only for reading closes without an event of the directory's watch, so an
    /// attempt that was refused and closes its file wakes nobody.
    pub(crate) fn open_with(
        &self,
        file: &str,
        create: bool,
        write: bool,
    ) -> Result<Option<OpenFile>, BackendError> {
        let Some(fd) = self.open_raw(file, create, write)? else {
            return Ok(None);
        };
        let (id, _) = self.check(file, &fd)?;
        Ok(Some((fd, id)))
    }

    /// Opens `file` without following a symbolic link; not checked yet (see
    /// [`check`](Dir::check)).
    fn open_raw(
        &self,
        file: &str,
        create: bool,
        write: bool,
    ) -> Result<Option<OwnedFd>, BackendError> {
        let mut flags = if write { OFlags::RDWR } else { OFlags::RDONLY };
        flags |= OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if create {
            flags |= OFlags::CREATE;
        }
        match fs::openat(&self.fd, file, flags, self.file_mode) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) if !create => Ok(None),
            Err(Errno::LOOP) => Err(BackendError::new(
                BackendErrorKind::UnexpectedKey,
                format!(
                    "{}: {file} is a symbolic link, which dlm never follows: remove it",
                    self.path.display()
                ),
            )
            .never_sent()),
            Err(e) => Err(io_error(&self.path.join(file), "open", e)),
        }
    }

    /// Checks the open `file`: a regular file this user may trust. Its device and inode,
    /// and whether it still has a link (a file removed, or replaced by a rename, has none).
    fn check(&self, file: &str, fd: &OwnedFd) -> Result<(Identity, bool), BackendError> {
        let st = fs::fstat(fd).map_err(|e| io_error(&self.path.join(file), "fstat", e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(BackendError::new(
                BackendErrorKind::UnexpectedKey,
                format!("{}: {file} is not a regular file", self.path.display()),
            )
            .never_sent());
        }
        let me = self.euid;
        if self.group_shared
            && st.st_uid == me
            && st.st_mode & 0o777 != self.file_mode.as_raw_mode()
        {
            // The umask may have taken the group's write bit off a file just made.
            fs::fchmod(fd, self.file_mode)
                .map_err(|e| io_error(&self.path.join(file), "chmod", e))?;
        }
        if !self.group_shared && st.st_uid != me {
            return Err(BackendError::new(
                BackendErrorKind::UnexpectedKey,
                format!(
                    "{}: {file} is owned by uid {}, not by this user: dlm uses no lock file \
                     another user made",
                    self.path.display(),
                    st.st_uid
                ),
            )
            .never_sent());
        }
        Ok(((st.st_dev, st.st_ino), st.st_nlink > 0))
    }

    /// One non-blocking attempt at the kernel lock `op` of `file`, opened (made if missing
    /// when `create`; for writing when `write`) and checked after the attempt (one `fstat`
    /// for both: the checks, and whether the file still has a link). `None`: no such file
    /// (and not `create`).
    pub(crate) fn lock(
        &self,
        file: &str,
        op: FlockOperation,
        create: bool,
        write: bool,
    ) -> Result<Option<Attempted>, BackendError> {
        let Some(fd) = self.open_raw(file, create, write)? else {
            return Ok(None);
        };
        self.lock_opened(file, fd, op).map(Some)
    }

    /// [`lock`](Dir::lock) of a file already open.
    pub(crate) fn lock_opened(
        &self,
        file: &str,
        fd: OwnedFd,
        op: FlockOperation,
    ) -> Result<Attempted, BackendError> {
        let locked = match fs::flock(&fd, op) {
            Ok(()) => true,
            Err(Errno::WOULDBLOCK) => false,
            Err(Errno::INTR) => return Ok(Attempted::Unlinked),
            Err(e) => {
                return Err(BackendError::new(
                    BackendErrorKind::Other,
                    format!("{}: flock: {e}", self.path.join(file).display()),
                ));
            }
        };
        let (id, linked) = self.check(file, &fd)?;
        Ok(match (linked, locked) {
            // Removed by its holder's release between our open and our attempt: a dead
            // inode, whatever the attempt gave.
            (false, _) => Attempted::Unlinked,
            (true, true) => Attempted::Locked((fd, id)),
            (true, false) => Attempted::Refused((fd, id)),
        })
    }

    /// A private directory `path` (made if missing), for the unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(path: &Path) -> Dir {
        Dir::open(
            path,
            DirOptions {
                group_shared: false,
                allow_network: false,
            },
        )
        .expect("a lock directory")
    }

    /// The device and inode `file` names now (`None`: no such file).
    pub(crate) fn identity_of(&self, file: &str) -> Result<Option<(u64, u64)>, BackendError> {
        match fs::statat(&self.fd, file, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some((st.st_dev, st.st_ino))),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io_error(&self.path.join(file), "stat", e)),
        }
    }

    /// The names of the directory's files that start with `prefix`.
    pub(crate) fn files_with_prefix(&self, prefix: &str) -> Result<Vec<String>, BackendError> {
        let fd = fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error(&self.path, "open", e))?;
        let mut dir = fs::Dir::new(fd).map_err(|e| io_error(&self.path, "read", e))?;
        let mut found = Vec::new();
        for entry in &mut dir {
            let entry = entry.map_err(|e| io_error(&self.path, "read", e))?;
            if let Ok(name) = entry.file_name().to_str()
                && name.starts_with(prefix)
            {
                found.push(name.to_owned());
            }
        }
        Ok(found)
    }

    /// Removes `file` from the directory.
    pub(crate) fn remove(&self, file: &str) -> Result<(), BackendError> {
        match fs::unlinkat(&self.fd, file, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(io_error(&self.path.join(file), "unlink", e)),
        }
    }
}

/// The device and inode of an open file.
pub(crate) fn identity(fd: impl AsFd) -> Result<(u64, u64), BackendError> {
    let st = fs::fstat(fd).map_err(|e| {
        BackendError::new(
            BackendErrorKind::Other,
            format!("fstat of a lock file: {e}"),
        )
    })?;
    Ok((st.st_dev, st.st_ino))
}
