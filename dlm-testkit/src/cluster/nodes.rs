//! What the nodes say, parsed: `CLUSTER NODES` lines, the slot owners, `INFO` fields.

use std::ops::RangeInclusive;

use super::SLOTS;

/// Whether `view` shows every slot of `slots` on node `id` (index `index`).
pub(super) fn serves_all(
    (i, view): &(usize, View),
    slots: &[RangeInclusive<u16>],
    id: &str,
    index: usize,
) -> Result<(), String> {
    let owners = owners(&view.lines);
    for slot in slots.iter().flat_map(|r| r.clone()) {
        if owners[usize::from(slot)] != Some(id) {
            return Err(format!("node {i} does not see slot {slot} on node {index}"));
        }
    }
    Ok(())
}

/// What one node says: `CLUSTER INFO`, `CLUSTER NODES` (parsed), `INFO replication`.
#[derive(Debug)]
pub(super) struct View {
    pub(super) info: String,
    pub(super) lines: Vec<NodeLine>,
    pub(super) replication: String,
}

impl View {
    pub(super) fn line(&self, id: &str) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.id == id)
    }

    pub(super) fn myself(&self) -> Option<&NodeLine> {
        self.lines.iter().find(|l| l.has("myself"))
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, PartialEq)]
pub(super) struct NodeLine {
    pub(super) id: String,
    pub(super) flags: Vec<String>,
    /// The master's id, for a replica.
    pub(super) master: Option<String>,
    /// Served slot ranges.
    pub(super) slots: Vec<(u16, u16)>,
    /// Slots being imported or migrated (`[slot-<-id]`, `[slot->-id]`; myself only).
    pub(super) open: Vec<u16>,
}

impl NodeLine {
    pub(super) fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// Parses `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv> <config-epoch>
/// <link-state> <slot> <slot> ...`.
pub(super) fn parse_nodes(text: &str) -> Result<Vec<NodeLine>, String> {
    let bad = |line: &str| format!("unexpected CLUSTER NODES line {line:?}");
    let slot = |s: &str, line: &str| s.parse::<u16>().map_err(|_| bad(line));
    let mut lines = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(bad(line));
        }
        let mut node = NodeLine {
            id: fields[0].to_owned(),
            flags: fields[2].split(',').map(str::to_owned).collect(),
            master: (fields[3] != "-").then(|| fields[3].to_owned()),
            slots: Vec::new(),
            open: Vec::new(),
        };
        for entry in &fields[8..] {
            if let Some(open) = entry.strip_prefix('[') {
                let number = open.split('-').next().unwrap_or_default();
                node.open.push(slot(number, line)?);
            } else if let Some((a, b)) = entry.split_once('-') {
                node.slots.push((slot(a, line)?, slot(b, line)?));
            } else {
                let s = slot(entry, line)?;
                node.slots.push((s, s));
            }
        }
        lines.push(node);
    }
    Ok(lines)
}

/// The owner (node id) of each slot.
pub(super) fn owners(lines: &[NodeLine]) -> Vec<Option<&str>> {
    let mut owners = vec![None; usize::from(SLOTS)];
    for line in lines {
        for &(a, b) in &line.slots {
            for s in a..=b.min(SLOTS - 1) {
                owners[usize::from(s)] = Some(line.id.as_str());
            }
        }
    }
    owners
}

/// The value of `name:` in `INFO`-style text.
pub(super) fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
}

/// The command as text, for messages.
pub(super) fn cmd_text(cmd: &redis::Cmd) -> String {
    let args = cmd.args_iter().map(|a| match a {
        redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
        _ => "<cursor>".to_owned(),
    });
    args.collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c3 127.0.0.1:30004@31004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@31002,host master - 0 1426238316232 2 connected 5461-10922 [77->-292f]
e7d1 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 16383 [93-<-292f]
";
        let lines = parse_nodes(text).unwrap();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].master.as_deref(), Some("e7d1"));
        assert!(lines[0].has("slave") && lines[0].slots.is_empty());
        assert_eq!(lines[1].slots, vec![(5461, 10922)]);
        assert_eq!(lines[1].open, vec![77]);
        assert!(lines[2].has("myself"));
        assert_eq!(lines[2].slots, vec![(0, 5460), (16383, 16383)]);
        assert_eq!(lines[2].open, vec![93]);
        let owners = owners(&lines);
        assert_eq!(owners[0], Some("e7d1"));
        assert_eq!(owners[6000], Some("67ed"));
        assert_eq!(owners[12000], None);
        assert!(parse_nodes("garbage").is_err());
    }
}
