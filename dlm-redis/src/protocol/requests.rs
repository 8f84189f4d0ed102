//! The lock requests, encoded from a lock's keys: the plain `SET NX`, and the scripts of
//! `src/protocol/lua/` (run with EVALSHA, loaded again on NOSCRIPT).

use std::sync::LazyLock;
use std::time::Duration;

use dlm_core::backend::{Claim, LockName, OwnerToken};
use redis::Script;

use super::call::{Call, Shape, evalsha};
use super::fencing::id_of_token;
use super::keys::{CHANNEL, Keys, LOCK, claim_suffix, millis};
use crate::transport::Resp;

struct Scripts {
    acquire: Script,
    extend: Script,
    release: Script,
    force_release: Script,
    inspect: Script,
    commit: Script,
    fence: Script,
    acquire_fenced: Script,
    handover: Script,
    claim: Script,
}

/// Loaded once per process; each `Script` knows its SHA1 (EVALSHA, reloaded on NOSCRIPT).
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    // The acquisition rule is written once (take.lua) and prepended to both acquire
    // scripts; the draw of a token likewise (draw.lua) to every script that draws one.
    acquire: Script::new(concat!(
        include_str!("lua/take.lua"),
        include_str!("lua/acquire.lua")
    )),
    extend: Script::new(include_str!("lua/extend.lua")),
    release: Script::new(include_str!("lua/release.lua")),
    force_release: Script::new(include_str!("lua/force_release.lua")),
    inspect: Script::new(include_str!("lua/inspect.lua")),
    commit: Script::new(include_str!("lua/commit.lua")),
    fence: Script::new(concat!(
        include_str!("lua/draw.lua"),
        include_str!("lua/fence.lua")
    )),
    acquire_fenced: Script::new(concat!(
        include_str!("lua/draw.lua"),
        include_str!("lua/take.lua"),
        include_str!("lua/acquire_fenced.lua")
    )),
    handover: Script::new(concat!(
        include_str!("lua/draw.lua"),
        include_str!("lua/handover.lua")
    )),
    claim: Script::new(concat!(
        include_str!("lua/draw.lua"),
        include_str!("lua/claim.lua")
    )),
});

/// The member of `owner`'s hold of kind `claim` in the resource's hash: `p:` (a permit),
/// `r:` (a read hold) or `w:` (a write hold), then the owner token.
pub(crate) fn claim_member(claim: Claim, owner: &OwnerToken) -> Vec<u8> {
    let class: &[u8] = match claim {
        Claim::Read => b"r:",
        Claim::Write => b"w:",
        _ => b"p:",
    };
    [class, owner.encoded().as_bytes()].concat()
}

impl Keys {
    /// `SET key token NX PX ms GET`: takes a free lock without running a script (Redis 7.0
    /// or later).
    pub(crate) fn set_call(&self, name: &LockName, owner: &OwnerToken, ttl: Duration) -> Call {
        let mut r = Resp::new();
        r.command(7).arg(b"SET");
        self.arg(&mut r, name, LOCK);
        r.arg(owner.encoded().as_bytes())
            .arg(b"NX")
            .arg(b"PX")
            .arg_u64(millis(ttl))
            .arg(b"GET");
        Call::new(r, Shape::SetGet)
    }

    /// The acquire script: takes the lock if free, refreshes it if already ours, reports
    /// the holder's remaining lease otherwise (`src/protocol/lua/acquire.lua`).
    pub(crate) fn acquire_script_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Call {
        let script = &SCRIPTS.acquire;
        let mut r = evalsha(script, 1, 2);
        self.arg(&mut r, name, LOCK);
        r.arg(owner.encoded().as_bytes()).arg_u64(millis(ttl));
        Call::new(r, Shape::Script(script))
    }

    /// The acquire script with the token's draw: takes the lock if free (or refreshes it
    /// if already ours) and then, in the same step, draws the fencing token as the fence
    /// script would (`src/protocol/lua/acquire_fenced.lua`).
    pub(crate) fn acquire_fenced_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        ttl: Duration,
        proposal: Option<u64>,
    ) -> Call {
        let script = &SCRIPTS.acquire_fenced;
        let mut r = evalsha(script, 2, 4);
        self.arg(&mut r, name, LOCK);
        self.fence_arg(&mut r, name);
        let proposal = proposal.map_or_else(|| "0".to_owned(), id_of_token);
        r.arg(owner.encoded().as_bytes())
            .arg_u64(millis(ttl))
            .arg(proposal.as_bytes())
            .arg_u64(self.fence_ttl_ms);
        Call::new(r, Shape::Script(script))
    }

    /// The hand-over script: if the lock is `owner`'s, it becomes `next`'s for `ttl`, its
    /// token drawn in the same step when `fenced` (`src/protocol/lua/handover.lua`). The
    /// reply parses as the fenced acquire script's.
    pub(crate) fn handover_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        next: &OwnerToken,
        ttl: Duration,
        fenced: bool,
    ) -> Call {
        let script = &SCRIPTS.handover;
        let mut r = evalsha(script, 2, 5);
        self.arg(&mut r, name, LOCK);
        self.fence_arg(&mut r, name);
        r.arg(owner.encoded().as_bytes())
            .arg(next.encoded().as_bytes())
            .arg_u64(millis(ttl))
            .arg(if fenced { b"1" } else { b"0" })
            .arg_u64(self.fence_ttl_ms);
        Call::new(r, Shape::Script(script))
    }

    /// The fence script: if the lock is still `owner`'s, takes the `proposal` (a token,
    /// Redlock) as the stream's new last ID when the stream exists and is below it, or
    /// draws a new ID (`src/protocol/lua/fence.lua`).
    pub(crate) fn fence_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        proposal: Option<u64>,
    ) -> Call {
        let script = &SCRIPTS.fence;
        let mut r = evalsha(script, 2, 3);
        self.arg(&mut r, name, LOCK);
        self.fence_arg(&mut r, name);
        let proposal = proposal.map_or_else(|| "0".to_owned(), id_of_token);
        r.arg(owner.encoded().as_bytes())
            .arg(proposal.as_bytes())
            .arg_u64(self.fence_ttl_ms);
        Call::new(r, Shape::Script(script))
    }

    /// A script call over the lock key (and `second` key, if any) with `args`.
    fn script_call(
        &self,
        script: &'static Script,
        name: &LockName,
        channel: bool,
        args: &[&[u8]],
    ) -> Call {
        let mut r = evalsha(script, 1, args.len() + usize::from(channel));
        self.arg(&mut r, name, LOCK);
        if channel {
            self.arg(&mut r, name, CHANNEL);
        }
        for a in args {
            r.arg(a);
        }
        Call::new(r, Shape::Script(script))
    }

    /// Compare-and-PEXPIRE; the reply parses with [`parse_flag`](Self::parse_flag).
    pub(crate) fn extend_call(&self, name: &LockName, owner: &OwnerToken, ttl: Duration) -> Call {
        let mut ms = itoa::Buffer::new();
        self.script_call(
            &SCRIPTS.extend,
            name,
            false,
            &[
                owner.encoded().as_bytes(),
                ms.format(millis(ttl)).as_bytes(),
            ],
        )
    }

    /// Redlock's commit round (when no proposal was taken by a quorum): raises the slot's
    /// fencing stream to the ID of `token` if the lock is still ours.
    pub(crate) fn commit_call(&self, name: &LockName, owner: &OwnerToken, token: u64) -> Call {
        let script = &SCRIPTS.commit;
        let mut r = evalsha(script, 2, 3);
        self.arg(&mut r, name, LOCK);
        self.fence_arg(&mut r, name);
        r.arg(owner.encoded().as_bytes())
            .arg(id_of_token(token).as_bytes())
            .arg_u64(self.fence_ttl_ms);
        Call::new(r, Shape::Script(script))
    }

    /// Releases if ours, publishing `release_id` on the lock's channel.
    pub(crate) fn release_call(
        &self,
        name: &LockName,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Call {
        let mut id = itoa::Buffer::new();
        self.script_call(
            &SCRIPTS.release,
            name,
            true,
            &[owner.encoded().as_bytes(), id.format(release_id).as_bytes()],
        )
    }

    pub(crate) fn force_release_call(&self, name: &LockName, release_id: u64) -> Call {
        let mut id = itoa::Buffer::new();
        self.script_call(
            &SCRIPTS.force_release,
            name,
            true,
            &[id.format(release_id).as_bytes()],
        )
    }

    pub(crate) fn inspect_call(&self, name: &LockName) -> Call {
        self.script_call(&SCRIPTS.inspect, name, false, &[])
    }

    /// The claim script's release of `owner`'s `claim` hold of the resource `name`,
    /// publishing `release_id` on the resource's channel.
    pub(crate) fn claim_release_call(
        &self,
        name: &LockName,
        claim: Claim,
        owner: &OwnerToken,
        release_id: u64,
    ) -> Call {
        let member = claim_member(claim, owner);
        let channel = self.claim_channel(name, claim);
        let mut id = itoa::Buffer::new();
        self.claim_call(
            name,
            claim,
            "release",
            &member,
            &[channel.as_bytes(), id.format(release_id).as_bytes()],
        )
    }

    /// The claim script (`src/protocol/lua/claim.lua`): operation `op` on `member`'s hold
    /// of the `claim` resource `name`, with `args` after the member.
    pub(crate) fn claim_call(
        &self,
        name: &LockName,
        claim: Claim,
        op: &str,
        member: &[u8],
        args: &[&[u8]],
    ) -> Call {
        let script = &SCRIPTS.claim;
        let mut r = evalsha(script, 2, 2 + args.len());
        self.arg(&mut r, name, claim_suffix(claim));
        self.fence_arg_of_slot(&mut r, self.claim_slot(name, claim));
        r.arg(op.as_bytes()).arg(member);
        for a in args {
            r.arg(a);
        }
        Call::new(r, Shape::Script(script))
    }
}
