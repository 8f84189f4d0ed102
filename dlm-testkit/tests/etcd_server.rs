//! The testkit's etcd processes: a member comes up on free ports, keeps its data across
//! a `kill -9` and restart, a cluster elects a new leader when its leader is killed, and
//! every process is gone once its handle is dropped.

use std::time::{Duration, Instant};

use dlm_testkit::etcd::{EtcdCluster, EtcdServer, live_etcd_pids};

fn put(m: &EtcdServer, key_b64: &str, value_b64: &str) {
    let (code, body) = m
        .request(
            "POST",
            "/v3/kv/put",
            &format!(r#"{{"key":"{key_b64}","value":"{value_b64}"}}"#),
        )
        .unwrap();
    assert_eq!(code, 200, "{body}");
}

fn get(m: &EtcdServer, key_b64: &str) -> String {
    let (code, body) = m
        .request("POST", "/v3/kv/range", &format!(r#"{{"key":"{key_b64}"}}"#))
        .unwrap();
    assert_eq!(code, 200, "{body}");
    body
}

#[test]
fn a_member_keeps_its_data_across_kill_9_and_restart() {
    let mut m = EtcdServer::spawn();
    assert!(m.is_healthy());
    let pid = m.pid();
    assert!(live_etcd_pids().contains(&pid));
    put(&m, "a2V5", "dmFsdWU="); // key = value
    let port = m.client_port();
    m.kill();
    assert!(!m.is_running());
    assert!(!live_etcd_pids().contains(&pid));
    assert!(!m.is_healthy());
    m.restart();
    assert_eq!(m.client_port(), port);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !m.is_healthy() {
        assert!(Instant::now() < deadline, "not healthy after the restart");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(get(&m, "a2V5").contains(r#""value":"dmFsdWU=""#));
    let pid = m.pid();
    drop(m);
    assert!(!live_etcd_pids().contains(&pid));
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[test]
fn a_paused_member_answers_nothing_until_resumed() {
    let m = EtcdServer::spawn();
    m.pause();
    assert!(m.is_paused());
    assert!(
        m.request("GET", "/version", "").is_err(),
        "a stopped member answered"
    );
    m.resume();
    assert!(m.request("GET", "/version", "").is_ok());
}

#[test]
fn a_cluster_elects_a_new_leader_when_its_leader_is_killed() {
    let mut c = EtcdCluster::spawn(3);
    assert_eq!(c.len(), 3);
    let pids: Vec<u32> = (0..3).map(|i| c.get(i).pid()).collect();
    let leader = c.wait_for_leader();
    put(c.get(leader), "Y2x1c3Rlcg==", "MQ==");
    c.get_mut(leader).kill();
    let next = c.wait_for_leader();
    assert_ne!(next, leader);
    let follower = (0..3).find(|&i| i != leader && i != next).unwrap();
    assert!(get(c.get(follower), "Y2x1c3Rlcg==").contains(r#""value":"MQ==""#));
    // Every member killed, then all restarted: the data is still there.
    c.restart_all();
    assert!(get(c.get(leader), "Y2x1c3Rlcg==").contains(r#""value":"MQ==""#));
    let pids_after: Vec<u32> = (0..3).map(|i| c.get(i).pid()).collect();
    drop(c);
    let live = live_etcd_pids();
    for pid in pids.iter().chain(&pids_after) {
        assert!(!live.contains(pid), "etcd pid {pid} left running");
    }
}

#[test]
fn two_clusters_have_different_ids() {
    let (a, b) = (EtcdServer::spawn(), EtcdServer::spawn());
    let id = |m: &EtcdServer| {
        let (_, body) = m.request("POST", "/v3/maintenance/status", "{}").unwrap();
        let start = body.find("\"cluster_id\":\"").unwrap() + 14;
        body[start..start + body[start..].find('"').unwrap()].to_owned()
    };
    assert_ne!(id(&a), id(&b));
}
