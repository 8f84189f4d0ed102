//! The backend's settings, and building it over a directory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use dlm_core::Error;
use parking_lot::Mutex;

use crate::dir::{Dir, DirOptions};
use crate::hints::{GroupHints, Registry};
use crate::state::{ReaperWake, State};
use crate::tokens::Tokens;
use crate::{FileBackend, Inner};

/// Builds a [`FileBackend`] with settings other than the defaults.
#[derive(Clone, Debug)]
#[must_use]
pub struct FileBackendBuilder {
    path: PathBuf,
    group_shared: bool,
    allow_network_fs: bool,
    fencing: bool,
}

impl FileBackendBuilder {
    /// The default settings over the directory `path`.
    pub(crate) fn new(path: &std::path::Path) -> Self {
        FileBackendBuilder {
            path: path.to_owned(),
            group_shared: false,
            allow_network_fs: false,
            fencing: true,
        }
    }

    /// Shares the directory with its group: made `0770` (lock files `0660`), and lock
    /// files made by other members of the group are used. The default is `false`: `0700`
    /// and this user's files only.
    pub fn group_shared(mut self, on: bool) -> Self {
        self.group_shared = on;
        self
    }

    /// Accepts a directory on a network file system (NFS, SMB/CIFS, FUSE, Ceph, AFS, 9p).
    /// Refused by default: there `flock` is the server's lock (or a local one that other
    /// machines do not see), which may be lost with a lease the client does not watch,
    /// and inotify does not see other machines' changes.
    pub fn allow_network_fs(mut self, on: bool) -> Self {
        self.allow_network_fs = on;
        self
    }

    /// Whether holds get fencing tokens (the default: yes). Off, the counter file is
    /// never touched and [`fencing_token`](dlm_core::LockGuard::fencing_token) is
    /// `Unsupported`.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Opens the directory (making it, and its missing parents, if it does not exist) and
    /// checks it. Nothing is created inside it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the directory cannot be trusted (a symbolic link,
    /// not a directory, another user's, writable by others, on a network file system);
    /// a [`BackendErrorKind::Permission`](dlm_core::backend::BackendErrorKind::Permission) error when it cannot be made or written.
    pub fn build(self) -> Result<FileBackend, Error> {
        let dir = Dir::open(
            &self.path,
            DirOptions {
                group_shared: self.group_shared,
                allow_network: self.allow_network_fs,
            },
        )?;
        let state = Arc::new(State {
            dir,
            holds: Mutex::new(HashMap::new()),
            probes: Arc::new(Mutex::new(HashMap::new())),
            registry: Arc::new(Registry::default()),
            tokens: Tokens::default(),
            fencing: self.fencing,
            recent: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
            reaper_wake: Mutex::new(ReaperWake::default()),
            groups: Mutex::new(HashMap::new()),
            marks: Mutex::new(HashMap::new()),
            group_hints: Arc::new(GroupHints::default()),
        });
        Ok(FileBackend {
            inner: Arc::new(Inner {
                state,
                listener: Mutex::new(None),
                reaper: Mutex::new(None),
            }),
        })
    }
}
