//! When fencing tokens are drawn ([`TokenDraw`]): below the client and the lock state,
//! which both use it.

/// When a hold's fencing token is drawn: set with [`LockClientBuilder::token_draw`](crate::LockClientBuilder::token_draw).
///
/// A token read with [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) is
/// drawn either with the acquisition (in the same request, on the backends where a token
/// costs a write: [`LockBackend::try_acquire_fenced`](crate::backend::LockBackend::try_acquire_fenced))
/// or on its first read (one more request). Which one costs less depends on whether the
/// token will be read, which the client predicts from the last hold of the same lock.
/// Every choice gives the same tokens and the same guarantees; only the cost moves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenDraw {
    /// With the acquisition when the last hold of this lock by this client read its
    /// token, else on the first read (the default); a lock this client has not held yet
    /// is predicted from its last hold of any lock, so a program that takes a lock per
    /// entity (`order-123`) and reads every token pays for them in the acquisition from
    /// the first hold of each. A lock whose tokens are read every time pays no request
    /// for them after the client's first hold; one whose tokens are never read pays
    /// nothing; a change costs one request (the first read after unread holds) or one
    /// unused draw on the server (the first unread hold after a read). The prediction is
    /// a bit per lock name in a small table per client (4,096 bits, by a hash of the
    /// name): names that share a bit share a prediction.
    #[default]
    Predicted,
    /// Always with the acquisition: for a program that reads every token, and for a
    /// short-lived one (such as a command-line run) that has no earlier hold to predict
    /// from.
    AtAcquisition,
    /// Always on the first read: an acquisition never writes a token (the cost of
    /// fencing before this setting existed).
    WhenRead,
}
