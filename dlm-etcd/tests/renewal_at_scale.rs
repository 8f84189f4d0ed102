//! The renewal rule at scale on etcd: every kind of hold of a client is renewed in the
//! watchdog's round, its keys read in transactions of 128 sent at once, so that a client
//! with thousands of holds keeps them through a slow network.

use std::sync::Arc;
use std::time::Duration;

use dlm_core::backend::LockBackend;
use dlm_etcd::EtcdBackend;
use dlm_testkit::etcd::{EtcdCluster, EtcdServer};
use dlm_testkit::faults::FaultProxy;
use dlm_testkit::scale::ScaleBar;

/// The requests the members served, by gRPC method (`grpc_server_handled_total`; the
/// JSON gateway's requests are served as gRPC calls), summed over `members`.
fn served(members: &[&EtcdServer]) -> Vec<(&'static str, u64)> {
    let mut out = vec![("transactions", 0), ("keep-alives", 0), ("lease grants", 0)];
    for m in members {
        let (status, text) = m
            .request("GET", "/metrics", "")
            .expect("a member's /metrics");
        assert_eq!(status, 200, "/metrics: {text}");
        for line in text
            .lines()
            .filter(|l| l.starts_with("grpc_server_handled_total{"))
        {
            let n = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64;
            for (method, slot) in ["Txn", "LeaseKeepAlive", "LeaseGrant"].iter().zip(0..) {
                if line.contains(&format!("grpc_method=\"{method}\"")) {
                    out[slot].1 += n;
                }
            }
        }
    }
    out
}

/// The scale bar (`dlm_testkit::scale`) on a 3-member etcd, a proxy in front of each
/// member; the holds are taken by 4 threads (each acquisition is a round trip to etcd).
#[test]
fn every_kind_of_hold_at_scale_on_three_members() {
    let cluster = EtcdCluster::spawn(3);
    let proxies: Vec<FaultProxy> = (0..3)
        .map(|i| FaultProxy::start(cluster.get(i).client_port()))
        .collect();
    let via: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://127.0.0.1:{}", p.port()))
        .collect();
    let backend = |urls: &[String]| -> Arc<dyn LockBackend> {
        Arc::new(
            EtcdBackend::builder(urls)
                .io_timeout(Duration::from_secs(1))
                .build()
                .unwrap(),
        )
    };
    let members: Vec<&EtcdServer> = (0..3).map(|i| cluster.get(i)).collect();
    ScaleBar {
        what: "3 etcd members",
        backend: backend(&via),
        other: backend(&cluster.urls()),
        proxies: &proxies,
        takers: 4,
        counters: &|| served(&members),
        // One transaction per 128 keys read, and as many moves: 8.7 a round measured.
        at_most: ("transactions", 60.0),
    }
    .run();
}
