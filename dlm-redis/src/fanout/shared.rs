//! One encoding of a request for every node of a round.

use std::cell::RefCell;

use crate::node::{Dialect, Node};
use crate::protocol::Call;

/// `make` for [`Fanout::call_all`] when every node gets the same request (Redlock's
/// rounds): it is encoded once per round for each acquisition dialect in use
/// ([`Dialect`]: all nodes alike unless a server is older than 7.0) and its bytes are
/// shared, instead of encoded once per node. The nodes of a round share one key layout
/// (they are one backend's, built from its options). `make` builds the request for a
/// node in the dialect given (the node's at that moment, read once: a server found older
/// meanwhile does not get a request built for the other dialect).
pub(crate) fn same_for_all<'a>(
    make: impl Fn(&Node, Dialect) -> Call + 'a,
) -> impl Fn(usize, &Node) -> Call + 'a {
    // The call made in each dialect.
    let made: RefCell<[Option<Call>; 2]> = RefCell::new([None, None]);
    move |_, node| {
        let dialect = node.dialect();
        let mut made = made.borrow_mut();
        let slot = &mut made[dialect as usize];
        if let Some(call) = slot.as_mut() {
            return call.duplicate();
        }
        let mut call = make(node, dialect);
        let sent = call.duplicate();
        *slot = Some(call);
        sent
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use dlm_core::backend::{LockName, OwnerToken};

    use super::same_for_all;
    use crate::conn::{Endpoint, ParsedUrl};
    use crate::node::Node;
    use crate::options::Options;
    use crate::protocol::{Call, Shape};

    fn nodes(n: usize) -> Vec<Arc<Node>> {
        (0..n)
            .map(|i| {
                // Never connected: pools connect on first use.
                let url = ParsedUrl::parse(&format!("redis://127.0.0.1:{}", 1 + i)).unwrap();
                Arc::new(Node::new(
                    Endpoint::new(url, None).unwrap(),
                    &Options::redlock(),
                ))
            })
            .collect()
    }

    /// The lock, owner and lease the requests of these tests are for.
    fn request() -> (LockName, OwnerToken, Duration) {
        let name = LockName::new("job").unwrap();
        (
            name,
            OwnerToken::random_for_tests(1),
            Duration::from_secs(30),
        )
    }

    #[test]
    fn nodes_that_encode_alike_share_one_encoding_of_the_request() {
        let nodes = nodes(5);
        nodes[3].set_scripts_only();
        let (name, owner, ttl) = request();
        let make = same_for_all(|node, dialect| node.acquire_call_in(dialect, &name, &owner, ttl));
        let calls: Vec<_> = nodes.iter().enumerate().map(|(i, n)| make(i, n)).collect();
        for (i, call) in calls.iter().enumerate() {
            // Each node gets exactly what it would get on its own.
            let own = nodes[i].acquire_call(&name, &owner, ttl);
            assert_eq!(call.bytes(), own.bytes(), "node {i}");
        }
        let same = |a: usize, b: usize| std::ptr::eq(calls[a].bytes(), calls[b].bytes());
        assert!(
            same(0, 1) && same(1, 2) && same(2, 4),
            "encoded once for the nodes alike"
        );
        assert!(
            !same(2, 3),
            "a node that needs the script has its own request"
        );
        assert!(matches!(calls[3].shape(), Some(Shape::Script(_))));
        assert!(matches!(calls[0].shape(), Some(Shape::SetGet)));
    }

    #[test]
    fn a_node_found_older_during_a_round_gets_the_request_of_its_own_dialect() {
        let nodes = nodes(3);
        let (name, owner, ttl) = request();
        let make = same_for_all(|node, dialect| node.acquire_call_in(dialect, &name, &owner, ttl));
        let first = make(0, &nodes[0]);
        // Another thread finds both servers older than 7.0 meanwhile.
        nodes[0].set_scripts_only();
        nodes[1].set_scripts_only();
        let second = make(1, &nodes[1]);
        let third = make(2, &nodes[2]);
        assert!(matches!(first.shape(), Some(Shape::SetGet)));
        assert_eq!(
            second.bytes(),
            nodes[1].acquire_call(&name, &owner, ttl).bytes(),
            "the script, not the SET made for the first node"
        );
        assert!(std::ptr::eq(first.bytes(), third.bytes()));
    }

    #[test]
    fn a_batch_is_shared_whole() {
        let nodes = nodes(2);
        let (name, owner, ttl) = request();
        let make = same_for_all(|node, _| {
            Call::batch([
                node.keys.extend_call(&name, &owner, ttl),
                node.keys.extend_call(&name, &owner, 2 * ttl),
            ])
        });
        let (a, b) = (make(0, &nodes[0]), make(1, &nodes[1]));
        assert!(std::ptr::eq(a.bytes(), b.bytes()));
        assert_eq!((a.len(), b.len()), (2, 2));
        assert_eq!(a.replies(), 2);
    }
}
