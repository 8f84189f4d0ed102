//! Lock names, validated before they reach a backend.

use std::fmt;
use std::sync::Arc;

use crate::error::InvalidArgument;

/// The longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 512;

/// The longest label a client gives its holds, in bytes (see
/// [`LockClientBuilder::label`](crate::LockClientBuilder::label)).
pub const MAX_LABEL_LEN: usize = 256;

/// Checks a holder label: 1 to [`MAX_LABEL_LEN`] bytes without control characters.
pub(crate) fn check_label(label: &str) -> Result<(), InvalidArgument> {
    check("label", label, MAX_LABEL_LEN)
}

/// `text` is 1 to `max` bytes without control characters.
fn check(what: &'static str, text: &str, max: usize) -> Result<(), InvalidArgument> {
    if text.is_empty() {
        return Err(InvalidArgument::new(what, "must not be empty"));
    }
    if text.len() > max {
        return Err(InvalidArgument::new(
            what,
            format!("is {} bytes, at most {max} allowed", text.len()),
        ));
    }
    if let Some(c) = text.chars().find(|c| c.is_control()) {
        return Err(InvalidArgument::new(
            what,
            format!("contains the control character {c:?}"),
        ));
    }
    Ok(())
}

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
        check("name", name, MAX_NAME_LEN)?;
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
