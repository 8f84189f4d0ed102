//! Tests of the real Redis Cluster topology (`dlm_testkit::cluster`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dlm_testkit::cluster::{RedisCluster, Role, SLOTS, key_in_slot, slot_of};
use dlm_testkit::redis_server::{live_server_pids, require_redis_server};
use redis::{Connection, RedisError, RedisResult};

/// The code of a redirection error and the node it names.
fn redirect(cluster: &RedisCluster, err: &RedisError) -> (String, u16, usize) {
    let code = err.code().unwrap_or_default().to_owned();
    let (addr, slot) = err
        .redirect_node()
        .unwrap_or_else(|| panic!("not a redirection: {err}"));
    let node = cluster
        .node_index(addr)
        .unwrap_or_else(|| panic!("redirection to unknown {addr}"));
    (code, slot, node)
}

fn get(con: &mut Connection, key: &str) -> RedisResult<Option<String>> {
    redis::cmd("GET").arg(key).query(con)
}

fn set(con: &mut Connection, key: &str, value: &str) -> RedisResult<()> {
    redis::cmd("SET").arg(key).arg(value).query(con)
}

#[test]
fn spawn_slots_and_moved() {
    require_redis_server();
    let started = Instant::now();
    let cluster = RedisCluster::spawn();
    eprintln!("spawn (3 masters + 3 replicas): {:?}", started.elapsed());

    assert_eq!(cluster.len(), 6);
    assert_eq!(cluster.masters(), vec![0, 1, 2]);
    for m in 0..3 {
        let replicas = cluster.replicas_of(m);
        assert_eq!(replicas, vec![3 + m]);
        assert_eq!(
            cluster.role(replicas[0]),
            Role::Replica {
                of: m,
                link_up: true
            }
        );
    }
    let seeds = cluster.seed_urls();
    assert_eq!(seeds.len(), 6);
    for (i, url) in seeds.iter().enumerate() {
        assert_eq!(
            *url,
            format!("redis://127.0.0.1:{}/", cluster.node(i).port())
        );
    }
    // The masters' slots cover every slot once, in order.
    let mut next = 0u32;
    for m in cluster.masters() {
        for range in cluster.slots_of(m) {
            assert_eq!(u32::from(*range.start()), next, "slots of node {m}");
            next = u32::from(*range.end()) + 1;
        }
    }
    assert_eq!(next, u32::from(SLOTS));

    let mut con = cluster.node(4).connection();
    let keys: [&[u8]; 15] = [
        b"",
        b"a",
        b"foo",
        b"123456789",
        b"{a}b",
        b"{}x",
        b"a{b}{c}",
        b"{{x}}",
        b"{user1000}.following",
        b"}{",
        b"{a",
        b"a}b{",
        b"x{}{y}",
        b"\xff{\x00}\xfe",
        b"dlm:lock:orders",
    ];
    for key in keys {
        let want: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut con)
            .unwrap();
        assert_eq!(slot_of(key), want, "key {:?}", String::from_utf8_lossy(key));
    }
    assert_eq!(slot_of(b"{a}b"), slot_of(b"a"));
    assert_eq!(slot_of(b"a{b}{c}"), slot_of(b"b"));
    for slot in [0, 5461, 16383] {
        let key = key_in_slot(slot, "k");
        let want: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&key)
            .query(&mut con)
            .unwrap();
        assert_eq!(want, slot, "{key}");
    }

    // A write at the wrong master is redirected to the right one.
    let key = "dlm:moved";
    let slot = slot_of(key.as_bytes());
    let owner = cluster.master_of_slot(slot);
    assert!(cluster.slots_of(owner).iter().any(|r| r.contains(&slot)));
    for wrong in cluster.masters().into_iter().filter(|&m| m != owner) {
        let err = set(&mut cluster.node(wrong).connection(), key, "v").unwrap_err();
        assert_eq!(redirect(&cluster, &err), ("MOVED".to_owned(), slot, owner));
    }
    let mut at_owner = cluster.node(owner).connection();
    set(&mut at_owner, key, "v").unwrap();
    assert_eq!(get(&mut at_owner, key).unwrap().as_deref(), Some("v"));
}

#[test]
fn stepwise_migration_asks_then_moves() {
    require_redis_server();
    let password = "p@ss:w/rd";
    let cluster = RedisCluster::builder().password(password).spawn();
    let url = &cluster.seed_urls()[0];
    assert_eq!(
        *url,
        format!(
            "redis://:p%40ss%3Aw%2Frd@127.0.0.1:{}/",
            cluster.node(0).port()
        )
    );

    let keys = ["{mig}a", "{mig}b"];
    let slot = slot_of(b"{mig}");
    let source = cluster.master_of_slot(slot);
    let target = cluster
        .masters()
        .into_iter()
        .find(|&m| m != source)
        .unwrap();
    let mut src = cluster.node(source).connection();
    let mut dst = cluster.node(target).connection();
    for key in keys {
        set(&mut src, key, &format!("value of {key}")).unwrap();
    }

    let started = Instant::now();
    let migration = cluster.begin_migration(slot, target);
    assert_eq!(
        (migration.slot(), migration.source(), migration.target()),
        (slot, source, target)
    );
    assert_eq!(migration.move_some(1), 1);
    // EXISTS would answer ASK for the moved key: list what the source still holds.
    let left: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut src)
        .unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    let stayed = keys.into_iter().find(|k| *k == left[0]).unwrap();
    let moved = keys.into_iter().find(|k| *k != stayed).unwrap();
    // The source serves what it still holds and sends the client to the target for the rest.
    assert_eq!(
        get(&mut src, stayed).unwrap(),
        Some(format!("value of {stayed}"))
    );
    let err = get(&mut src, moved).unwrap_err();
    assert_eq!(redirect(&cluster, &err), ("ASK".to_owned(), slot, target));
    let err = set(&mut src, "{mig}new", "x").unwrap_err();
    assert_eq!(redirect(&cluster, &err), ("ASK".to_owned(), slot, target));
    // A multi-key command across moved and unmoved keys must wait.
    let err = redis::cmd("MGET")
        .arg(&keys)
        .query::<Vec<Option<String>>>(&mut src)
        .unwrap_err();
    assert_eq!(err.code(), Some("TRYAGAIN"), "{err}");
    // The target serves the moved key only after ASKING; otherwise it sends the client back.
    let err = get(&mut dst, moved).unwrap_err();
    assert_eq!(redirect(&cluster, &err), ("MOVED".to_owned(), slot, source));
    let (value,): (Option<String>,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("GET")
        .arg(moved)
        .query(&mut dst)
        .unwrap();
    assert_eq!(value, Some(format!("value of {moved}")));

    assert_eq!(migration.move_keys(), 1);
    migration.finish();
    eprintln!("stepwise migration of 2 keys: {:?}", started.elapsed());

    assert_eq!(cluster.master_of_slot(slot), target);
    for key in keys {
        let err = get(&mut src, key).unwrap_err();
        assert_eq!(redirect(&cluster, &err), ("MOVED".to_owned(), slot, target));
        assert_eq!(get(&mut dst, key).unwrap(), Some(format!("value of {key}")));
    }
    // Every node, replicas too, sends a client for the slot to the target.
    for i in 0..cluster.len() {
        let err = get(&mut cluster.node(i).connection(), "{mig}b").err();
        if i != target {
            let err = err.unwrap_or_else(|| panic!("node {i} served the key"));
            assert_eq!(redirect(&cluster, &err), ("MOVED".to_owned(), slot, target));
        }
    }

    // And back in one go.
    let started = Instant::now();
    cluster.migrate_slot(slot, source);
    eprintln!("one-shot migration of 2 keys: {:?}", started.elapsed());
    assert_eq!(cluster.master_of_slot(slot), source);
    for key in keys {
        assert_eq!(get(&mut src, key).unwrap(), Some(format!("value of {key}")));
    }
}

#[test]
fn manual_failover_promotes_the_replica() {
    require_redis_server();
    let cluster = RedisCluster::spawn();
    let master = 1;
    let slots = cluster.slots_of(master);
    let slot = *slots[0].start();
    let key = key_in_slot(slot, "dlm:failover");
    set(&mut cluster.node(master).connection(), &key, "before").unwrap();
    let replicas = cluster.replicas_of(master);

    let started = Instant::now();
    let new = cluster.failover(master);
    eprintln!("manual failover: {:?}", started.elapsed());

    assert!(replicas.contains(&new), "{new} not in {replicas:?}");
    assert_eq!(cluster.role(new), Role::Master);
    assert_eq!(
        cluster.role(master),
        Role::Replica {
            of: new,
            link_up: true
        }
    );
    assert_eq!(cluster.master_of_slot(slot), new);
    assert_eq!(cluster.slots_of(new), slots);
    assert!(cluster.slots_of(master).is_empty());
    assert!(cluster.masters().contains(&new) && !cluster.masters().contains(&master));
    assert_eq!(cluster.replicas_of(new), vec![master]);
    let mut at_new = cluster.node(new).connection();
    assert_eq!(get(&mut at_new, &key).unwrap().as_deref(), Some("before"));
    set(&mut at_new, &key, "after").unwrap();
    let err = get(&mut cluster.node(master).connection(), &key).unwrap_err();
    assert_eq!(redirect(&cluster, &err), ("MOVED".to_owned(), slot, new));
}

#[test]
fn killed_master_is_replaced() {
    require_redis_server();
    let mut cluster = RedisCluster::builder()
        .node_timeout(Duration::from_millis(1000))
        .spawn();
    let master = 0;
    let slot = *cluster.slots_of(master)[0].start();
    let key = key_in_slot(slot, "dlm:kill");
    let mut con = cluster.node(master).connection();
    set(&mut con, &key, "kept").unwrap();
    let acked: usize = redis::cmd("WAIT").arg(1).arg(5000).query(&mut con).unwrap();
    assert_eq!(acked, 1, "the replica did not acknowledge the write");
    let replicas = cluster.replicas_of(master);

    cluster.node_mut(master).kill();
    let started = Instant::now();
    let new = cluster.wait_for_master_change(master, Duration::from_secs(20));
    eprintln!(
        "automatic failover after kill (node timeout 1 s): {:?}",
        started.elapsed()
    );

    assert!(replicas.contains(&new), "{new} not in {replicas:?}");
    assert_eq!(cluster.role(new), Role::Master);
    assert_eq!(cluster.master_of_slot(slot), new);
    assert!(!cluster.masters().contains(&master));
    let mut at_new = cluster.node(new).connection();
    assert_eq!(get(&mut at_new, &key).unwrap().as_deref(), Some("kept"));

    // Restarted (same port, bus port and nodes.conf), the old master rejoins as a replica.
    let started = Instant::now();
    cluster.node_mut(master).restart();
    cluster.wait_stable(Duration::from_secs(20));
    eprintln!("old master rejoined as a replica: {:?}", started.elapsed());
    assert_eq!(
        cluster.role(master),
        Role::Replica {
            of: new,
            link_up: true
        }
    );
    assert_eq!(cluster.master_of_slot(slot), new);
}

#[test]
fn drop_kills_every_node() {
    require_redis_server();
    let cluster = RedisCluster::spawn();
    let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid()).collect();
    let dirs: Vec<PathBuf> = cluster.nodes().iter().map(|n| n.dir().to_owned()).collect();
    let live = live_server_pids();
    assert!(pids.iter().all(|pid| live.contains(pid)));
    assert!(dirs.iter().all(|d| d.join("nodes.conf").is_file()));
    drop(cluster);
    let live = live_server_pids();
    for (pid, dir) in pids.iter().zip(&dirs) {
        assert!(!live.contains(pid), "pid {pid} still registered");
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "pid {pid} still exists"
        );
        assert!(!dir.exists(), "{} not removed", dir.display());
    }
}
