//! Lock names, validated before they reach a backend.

use std::fmt;
use std::sync::Arc;

use crate::error::InvalidArgument;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// A validated lock name: 1 to [`MAX_NAME_LEN`] bytes of UTF-8 without control characters.
///
/// Cheap to clone. Backends receive names only in this form, so they never see an empty,
/// over-long or control-character name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockName(Arc<str>);

impl LockName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`InvalidArgument`] (argument `"name"`) when it is empty, longer than
    /// [`MAX_NAME_LEN`] bytes, or contains a control character (NUL, newline, ...).
    pub fn new(name: &str) -> Result<Self, InvalidArgument> {
        if name.is_empty() {
            return Err(InvalidArgument::new("name", "must not be empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(InvalidArgument::new(
                "name",
                format!("is {} bytes, at most {MAX_NAME_LEN} allowed", name.len()),
            ));
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            return Err(InvalidArgument::new(
                "name",
                format!("contains the control character {c:?}"),
            ));
        }
        Ok(LockName(name.into()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
