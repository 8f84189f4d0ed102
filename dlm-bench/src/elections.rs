//! `dlm-bench --elections`: leader election side by side with etcd's own election service
//! (`/v3/election`, through the same JSON gateway), in one run:
//! - hand-over: the leader resigns while a candidate waits in its campaign; the time from
//!   the resignation's call to the candidate's campaign returning;
//! - observe: a leader publishes a new value (`proclaim`); the time from the call to an
//!   observer (another client, blocked on its next change) seeing it.
//!
//! Each is measured `rounds` times per system, on one Redis server and on one etcd member,
//! with the server's round trip for scale (Redis `PING`, an etcd range read).

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use dlm_core::LockClient;
use dlm_core::backend::LockBackend;

/// One system's figures: (hand-over samples, observe samples).
type Samples = (Vec<Duration>, Vec<Duration>);

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6
}

/// dlm's election over `backend` (a new backend per client, as separate processes have).
fn dlm(backend: &dyn Fn() -> std::sync::Arc<dyn LockBackend>, rounds: usize) -> Samples {
    let name = format!("bench-election-{}", rand::random::<u32>());
    let client = || LockClient::new(backend());
    let (a, b) = (
        client().get_election(&name).unwrap(),
        client().get_election(&name).unwrap(),
    );
    let mut handover = Vec::with_capacity(rounds);
    let mut lead = a.campaign("a").unwrap();
    for i in 0..rounds {
        // The other candidate campaigns on a thread and reports when it leads.
        let next = if i % 2 == 0 { b.clone() } else { a.clone() };
        let (tx, rx) = mpsc::channel();
        let candidate = thread::spawn(move || {
            let l = next.campaign("next").unwrap();
            tx.send(Instant::now()).unwrap();
            l
        });
        // Wait until it is refused once and waits: its first attempt is over when the
        // election shows it has a waiter (a short settle instead; the wait is woken by the
        // release either way, which is what is measured).
        thread::sleep(Duration::from_millis(20));
        let resigned = Instant::now();
        lead.resign().unwrap();
        let led = rx.recv().unwrap();
        handover.push(led - resigned);
        lead = candidate.join().unwrap();
    }
    // Observe: a new value, seen by an observer of another client (on a thread of its
    // own, which notes when each change reaches it).
    let watcher = client().get_election(&name).unwrap();
    let (seen_tx, seen_rx) = mpsc::channel::<(Instant, Option<String>)>();
    let (ready_tx, ready_rx) = mpsc::channel();
    let observer = thread::spawn(move || {
        let mut changes = watcher.observe();
        let _current = changes.next().unwrap().unwrap();
        ready_tx.send(()).unwrap();
        for change in changes {
            let at = Instant::now();
            let value = change.unwrap().and_then(|l| l.value().map(str::to_owned));
            if seen_tx.send((at, value)).is_err() {
                return;
            }
        }
    });
    ready_rx.recv().unwrap();
    let mut observe = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let value = format!("v{i}");
        let proclaimed = Instant::now();
        lead.proclaim(&value).unwrap();
        loop {
            let (at, seen) = seen_rx.recv().unwrap();
            if seen.as_deref() == Some(value.as_str()) {
                observe.push(at - proclaimed);
                break;
            }
        }
    }
    drop(seen_rx);
    lead.resign().unwrap();
    observer.join().unwrap();
    (handover, observe)
}

/// etcd's own election service through the JSON gateway: `campaign` (blocks until this
/// lease's key is the oldest), `resign`, `proclaim`, and `observe` (a stream of the
/// leader's values).
fn etcd_service(base: &str, rounds: usize) -> Samples {
    let name = STANDARD.encode(format!("bench-election-{}", rand::random::<u32>()));
    let agent = || {
        ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .build()
    };
    let post = |agent: &ureq::Agent, path: &str, body: String| -> serde_json::Value {
        agent
            .post(&format!("{base}{path}"))
            .set("Content-Type", "application/json")
            .send_string(&body)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .into_string()
            .map(|body| serde_json::from_str(&body).unwrap())
            .unwrap()
    };
    let grant = |agent: &ureq::Agent| -> String {
        post(agent, "/v3/lease/grant", r#"{"TTL":"60"}"#.into())["ID"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let campaign = |agent: &ureq::Agent, lease: &str, value: &str| -> serde_json::Value {
        post(
            agent,
            "/v3/election/campaign",
            serde_json::json!({ "name": name, "lease": lease, "value": STANDARD.encode(value) })
                .to_string(),
        )["leader"]
            .clone()
    };
    let (agent_a, agent_b) = (agent(), agent());
    let (lease_a, lease_b) = (grant(&agent_a), grant(&agent_b));
    let mut handover = Vec::with_capacity(rounds);
    let mut leader = campaign(&agent_a, &lease_a, "a");
    let mut leader_agent = agent_a.clone();
    for i in 0..rounds {
        let (next_agent, next_lease) = if i % 2 == 0 {
            (agent_b.clone(), lease_b.clone())
        } else {
            (agent_a.clone(), lease_a.clone())
        };
        let (tx, rx) = mpsc::channel();
        let base = base.to_owned();
        let name = name.clone();
        let candidate = thread::spawn(move || {
            let body = next_agent
                .post(&format!("{base}/v3/election/campaign"))
                .set("Content-Type", "application/json")
                .send_string(
                    &serde_json::json!({ "name": name, "lease": next_lease, "value": STANDARD.encode("next") })
                        .to_string(),
                )
                .unwrap()
                .into_string()
                .unwrap();
            let reply: serde_json::Value = serde_json::from_str(&body).unwrap();
            tx.send(Instant::now()).unwrap();
            (reply["leader"].clone(), next_agent)
        });
        thread::sleep(Duration::from_millis(20));
        let resigned = Instant::now();
        post(
            &leader_agent,
            "/v3/election/resign",
            serde_json::json!({ "leader": leader }).to_string(),
        );
        let led = rx.recv().unwrap();
        handover.push(led - resigned);
        let (l, a) = candidate.join().unwrap();
        leader = l;
        leader_agent = a;
    }
    // Observe: the gateway streams one JSON object per leader change.
    let stream = agent()
        .post(&format!("{base}/v3/election/observe"))
        .set("Content-Type", "application/json")
        .send_string(&serde_json::json!({ "name": name }).to_string())
        .unwrap()
        .into_reader();
    let (tx, rx) = mpsc::channel::<(Instant, String)>();
    thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stream)
            .lines()
            .map_while(Result::ok)
        {
            let v: serde_json::Value = match serde_json::from_str(&line) {
                Ok(v) => v,
                Err(_) => continue,
            };
            let Some(value) = v["result"]["kv"]["value"].as_str() else {
                continue;
            };
            let value = String::from_utf8(STANDARD.decode(value).unwrap()).unwrap();
            if tx.send((Instant::now(), value)).is_err() {
                return;
            }
        }
    });
    let _current = rx.recv().unwrap();
    let mut observe = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let value = format!("v{i}");
        let proclaimed = Instant::now();
        post(
            &leader_agent,
            "/v3/election/proclaim",
            serde_json::json!({ "leader": leader, "value": STANDARD.encode(&value) }).to_string(),
        );
        loop {
            let (at, seen) = rx.recv().unwrap();
            if seen == value {
                observe.push(at - proclaimed);
                break;
            }
        }
    }
    post(
        &leader_agent,
        "/v3/election/resign",
        serde_json::json!({ "leader": leader }).to_string(),
    );
    (handover, observe)
}

/// The round trip of `f` (p50 of 200), in microseconds.
fn rtt(mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    samples.sort();
    percentile(&samples, 0.5)
}

/// The same hand-over with a lock (`sem` false) or a semaphore of 1 permit, for scale:
/// sorted samples.
fn mutex_handover(
    backend: &dyn Fn() -> std::sync::Arc<dyn LockBackend>,
    rounds: usize,
    sem: bool,
) -> Vec<Duration> {
    use dlm_core::{Lock, LockGuard};
    let name = format!("bench-mutex-{}", rand::random::<u32>());
    let take = move |client: &LockClient, name: &str| -> LockGuard {
        if sem {
            client.get_semaphore(name, 1).unwrap().acquire().unwrap()
        } else {
            client.get_lock(name).unwrap().lock().unwrap()
        }
    };
    let (a, b) = (LockClient::new(backend()), LockClient::new(backend()));
    let mut out = Vec::new();
    for i in 0..rounds {
        let (holder, next) = if i % 2 == 0 {
            (&a, b.clone())
        } else {
            (&b, a.clone())
        };
        let held = take(holder, &name);
        let (tx, rx) = mpsc::channel();
        let n = name.clone();
        let waiter = thread::spawn(move || {
            let g = take(&next, &n);
            tx.send(Instant::now()).unwrap();
            drop(g);
        });
        // A settle, so that the other client waits (it is woken by the release either way).
        thread::sleep(Duration::from_millis(20));
        let released = Instant::now();
        held.unlock().unwrap();
        out.push(rx.recv().unwrap() - released);
        waiter.join().unwrap();
    }
    out.sort();
    out
}

/// The floor of a pub/sub-woken hand-over between two clients: a minimal client whose
/// waiter subscribes, tries `SET NX PX`, and on refusal blocks on its own subscription
/// (no listener thread, no wait loop); the holder releases with one script (`DEL` and
/// `PUBLISH`). The time from the release's call to the waiter's `SET` succeeding: sorted
/// samples.
fn minimal_handover(url: &str, rounds: usize) -> Vec<Duration> {
    use dlm_redis::redis;
    let key = format!("bench-minimal-{}", rand::random::<u32>());
    let channel = format!("{key}:released");
    let release = redis::Script::new(
        "redis.call('del', KEYS[1]); redis.call('publish', ARGV[1], '1'); return 1",
    );
    let client = redis::Client::open(url).unwrap();
    let mut holder = client.get_connection().unwrap();
    let mut out = Vec::new();
    for _ in 0..rounds {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("holder")
            .arg("PX")
            .arg(30_000)
            .query(&mut holder)
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (client, waiter_key, waiter_channel) = (client.clone(), key.clone(), channel.clone());
        let waiter = thread::spawn(move || {
            let (key, channel) = (waiter_key, waiter_channel);
            let mut sub = client.get_connection().unwrap();
            let mut con = client.get_connection().unwrap();
            let mut pubsub = sub.as_pubsub();
            pubsub.subscribe(&channel).unwrap();
            let mut first = true;
            loop {
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg("waiter")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query(&mut con)
                    .unwrap();
                if set.is_some() {
                    tx.send(Instant::now()).unwrap();
                    let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
                    return;
                }
                if first {
                    ready_tx.send(()).unwrap();
                    first = false;
                }
                let _ = pubsub.get_message().unwrap();
            }
        });
        ready_rx.recv().unwrap();
        // The same settle as dlm's rows, so that the waiter blocks on its subscription.
        thread::sleep(Duration::from_millis(20));
        let released = Instant::now();
        let _: i64 = release.key(&key).arg(&channel).invoke(&mut holder).unwrap();
        out.push(rx.recv().unwrap() - released);
        waiter.join().unwrap();
    }
    out.sort();
    out
}

/// The floor of an observer on Redis: the leader publishes its new value with one script
/// (`SET` and `PUBLISH` of the value), an observer blocked on its own subscription reads
/// it from the message (no listener thread, no read after the message). The time from
/// the call to the observer reading the value: sorted samples.
fn minimal_observe(url: &str, rounds: usize) -> Vec<Duration> {
    use dlm_redis::redis;
    let key = format!("bench-minimal-{}", rand::random::<u32>());
    let channel = format!("{key}:changed");
    let proclaim = redis::Script::new(
        "redis.call('set', KEYS[1], ARGV[2], 'PX', 30000); redis.call('publish', ARGV[1], ARGV[2]); return 1",
    );
    let client = redis::Client::open(url).unwrap();
    let mut leader = client.get_connection().unwrap();
    let (seen_tx, seen_rx) = mpsc::channel::<(Instant, String)>();
    let (ready_tx, ready_rx) = mpsc::channel();
    let observer_client = client.clone();
    let observer_channel = channel.clone();
    let observer = thread::spawn(move || {
        let mut sub = observer_client.get_connection().unwrap();
        let mut pubsub = sub.as_pubsub();
        pubsub.subscribe(&observer_channel).unwrap();
        ready_tx.send(()).unwrap();
        loop {
            let message = pubsub.get_message().unwrap();
            let at = Instant::now();
            let value: String = message.get_payload().unwrap();
            let last = value == "stop";
            if seen_tx.send((at, value)).is_err() || last {
                return;
            }
        }
    });
    ready_rx.recv().unwrap();
    let mut out = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let value = format!("v{i}");
        let proclaimed = Instant::now();
        let _: i64 = proclaim
            .key(&key)
            .arg(&channel)
            .arg(&value)
            .invoke(&mut leader)
            .unwrap();
        loop {
            let (at, seen) = seen_rx.recv().unwrap();
            if seen == value {
                out.push(at - proclaimed);
                break;
            }
        }
    }
    let _: i64 = proclaim
        .key(&key)
        .arg(&channel)
        .arg("stop")
        .invoke(&mut leader)
        .unwrap();
    observer.join().unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut leader).unwrap();
    out.sort();
    out
}

/// Runs the election bench and prints its table.
pub fn run(rounds: usize) {
    let redis = dlm_testkit::redis_server::RedisServer::spawn();
    let member = dlm_testkit::etcd::EtcdServer::spawn();
    let redis_url = redis.url();
    let etcd_base = member.url();
    let redis_rtt = {
        let mut con = redis.connection();
        rtt(|| {
            let _: String = dlm_redis::redis::cmd("PING").query(&mut con).unwrap();
        })
    };
    let etcd_rtt = {
        let agent = ureq::AgentBuilder::new().build();
        let url = format!("{etcd_base}/v3/kv/range");
        rtt(|| {
            agent
                .post(&url)
                .send_string(r#"{"key":"eA=="}"#)
                .unwrap()
                .into_string()
                .unwrap();
        })
    };
    let redis_backend = || -> std::sync::Arc<dyn LockBackend> {
        std::sync::Arc::new(dlm_redis::RedisBackend::new(&redis_url).unwrap())
    };
    let etcd_backend = || -> std::sync::Arc<dyn LockBackend> {
        std::sync::Arc::new(dlm_etcd::EtcdBackend::new(&[etcd_base.as_str()]).unwrap())
    };
    // For scale: the same hand-over (between two clients of their own backends, from
    // the release's call) of a lock and of a one-permit semaphore.
    let lock = mutex_handover(&redis_backend, rounds, false);
    let permit = mutex_handover(&redis_backend, rounds, true);
    let minimal = minimal_handover(&redis_url, rounds);
    let minimal_observed = minimal_observe(&redis_url, rounds);
    let rows: Vec<(&str, f64, Samples)> = vec![
        ("dlm (redis)", redis_rtt, dlm(&redis_backend, rounds)),
        ("dlm (etcd)", etcd_rtt, dlm(&etcd_backend, rounds)),
        (
            "etcd /v3/election",
            etcd_rtt,
            etcd_service(&etcd_base, rounds),
        ),
    ];
    println!(
        "Elections: {rounds} hand-overs and {rounds} proclamations per system. RTT: the server's round trip (Redis PING, an etcd range read), p50."
    );
    println!("| system | RTT us | hand-over p50 us | p99 us | observe p50 us | p99 us |");
    println!("|---|---|---|---|---|---|");
    for (system, samples) in [
        ("dlm (redis) lock, for scale", &lock),
        ("dlm (redis) 1-permit semaphore, for scale", &permit),
    ] {
        println!(
            "| {system} | {redis_rtt:.0} | {:.0} ({:.1} RTT) | {:.0} | - | - |",
            percentile(samples, 0.5),
            percentile(samples, 0.5) / redis_rtt,
            percentile(samples, 0.99),
        );
    }
    let floor = (
        percentile(&minimal, 0.5),
        percentile(&minimal_observed, 0.5),
    );
    println!(
        "| minimal pub/sub client (redis), the floor | {redis_rtt:.0} | {:.0} ({:.1} RTT) | {:.0} | {:.0} ({:.1} RTT) | {:.0} |",
        floor.0,
        floor.0 / redis_rtt,
        percentile(&minimal, 0.99),
        floor.1,
        floor.1 / redis_rtt,
        percentile(&minimal_observed, 0.99),
    );
    for (system, rtt, (mut handover, mut observe)) in rows {
        handover.sort();
        observe.sort();
        if system == "dlm (redis)" {
            println!(
                "(dlm (redis) election against the floor: hand-over {:.2}x, observe {:.2}x)",
                percentile(&handover, 0.5) / floor.0,
                percentile(&observe, 0.5) / floor.1,
            );
        }
        println!(
            "| {system} | {rtt:.0} | {:.0} ({:.1} RTT) | {:.0} | {:.0} ({:.1} RTT) | {:.0} |",
            percentile(&handover, 0.5),
            percentile(&handover, 0.5) / rtt,
            percentile(&handover, 0.99),
            percentile(&observe, 0.5),
            percentile(&observe, 0.5) / rtt,
            percentile(&observe, 0.99),
        );
    }
}
