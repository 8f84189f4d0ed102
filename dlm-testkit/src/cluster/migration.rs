//! Slot migration: [`RedisCluster::begin_migration`] and the [`Migration`] it opens.

use super::nodes::serves_all;
use super::{CHANGE_TIMEOUT, MIGRATE_BATCH, MIGRATE_TIMEOUT_MS, RedisCluster, Role};

impl RedisCluster {
    /// Starts moving `slot` from its master to master `to`, in the order of the Redis
    /// docs (`CLUSTER SETSLOT`): `IMPORTING` on the target, then `MIGRATING` on the
    /// source. While the [`Migration`] is open, the source answers `ASK` for keys of the
    /// slot it no longer holds, and `TRYAGAIN` for multi-key commands that span moved and
    /// unmoved keys.
    ///
    /// # Panics
    /// When `to` is not a master or already serves the slot, or a command fails.
    pub fn begin_migration(&self, slot: u16, to: usize) -> Migration<'_> {
        let from = self.master_of_slot(slot);
        if from == to {
            self.fail(&format!("slot {slot} is already on node {to}"));
        }
        if self.role(to) != Role::Master {
            self.fail(&format!(
                "node {to} is not a master: cannot import slot {slot}"
            ));
        }
        let setslot = |node: usize, state: &str, other: usize| {
            let _: () = self.run(
                node,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(&self.ids[other]),
            );
        };
        setslot(to, "IMPORTING", from);
        setslot(from, "MIGRATING", to);
        Migration {
            cluster: self,
            slot,
            source: from,
            target: to,
        }
    }

    /// Moves `slot` to master `to` in one go ([`begin_migration`](Self::begin_migration)
    /// then [`Migration::finish`]).
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        self.begin_migration(slot, to).finish();
    }
}

/// A slot migration under way (see [`RedisCluster::begin_migration`]). Finish it with
/// [`finish`](Self::finish): dropped unfinished, it leaves the slot half moved.
#[must_use = "a migration left unfinished leaves its slot MIGRATING/IMPORTING"]
#[derive(Debug)]
pub struct Migration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    source: usize,
    target: usize,
}

impl Migration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The node the slot moves from.
    pub fn source(&self) -> usize {
        self.source
    }

    /// The node the slot moves to.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Moves up to `max` of the slot's keys still on the source to the target
    /// (`CLUSTER GETKEYSINSLOT`, then one `MIGRATE ... KEYS`); returns how many it sent
    /// (0 once none is left).
    ///
    /// # Panics
    /// When a command fails.
    pub fn move_some(&self, max: usize) -> usize {
        let c = self.cluster;
        let keys: Vec<Vec<u8>> = c.run(
            self.source,
            redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(max),
        );
        if keys.is_empty() {
            return 0;
        }
        let target = &c.nodes[self.target];
        let mut migrate = redis::cmd("MIGRATE");
        migrate
            .arg("127.0.0.1")
            .arg(target.port())
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS);
        if let Some(pw) = &c.password {
            migrate.arg("AUTH").arg(pw);
        }
        migrate.arg("KEYS");
        for key in &keys {
            migrate.arg(key.as_slice());
        }
        // "NOKEY" when every key expired in between.
        let _: String = c.run(self.source, &migrate);
        keys.len()
    }

    /// Moves every key of the slot still on the source to the target, in batches of 100;
    /// returns how many it moved.
    ///
    /// # Panics
    /// When a command fails.
    pub fn move_keys(&self) -> usize {
        let mut moved = 0;
        loop {
            match self.move_some(MIGRATE_BATCH) {
                0 => return moved,
                n => moved += n,
            }
        }
    }

    /// Moves any keys left ([`move_keys`](Self::move_keys)), then assigns the slot to the
    /// target, in the order of the Redis docs: `CLUSTER SETSLOT <slot> NODE <target>` on
    /// the target, the source, then the other masters. Returns once every running node
    /// agrees that the target serves the slot, no node has it open, and the cluster is
    /// stable ([`RedisCluster::wait_stable`]).
    ///
    /// # Panics
    /// When a command fails, or the nodes do not agree within 20 s.
    pub fn finish(self) {
        self.move_keys();
        let c = self.cluster;
        let target_id = &c.ids[self.target];
        let assign = |node: usize| {
            let _: () = c.run(
                node,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(target_id),
            );
        };
        assign(self.target);
        assign(self.source);
        for m in c.masters() {
            if m != self.target && m != self.source {
                assign(m);
            }
        }
        let slot = self.slot;
        let what = format!("slot {slot} on node {} everywhere", self.target);
        c.wait_for(&what, CHANGE_TIMEOUT, || {
            let views = c.settled()?;
            for view in &views {
                serves_all(view, &[slot..=slot], target_id, self.target)?;
                let (i, view) = view;
                if view.myself().is_some_and(|me| me.open.contains(&slot)) {
                    return Err(format!("node {i} still has slot {slot} open"));
                }
            }
            Ok(())
        });
    }
}
