//! A server's connect worker: a thread that makes a connection when a fan-out finds
//! none idle, so that one slow connect does not hold up the other servers.

use parking_lot::Mutex;

/// A job for a node's connect worker.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// A node's connect worker: a thread that makes a connection when a fan-out finds none
/// idle (so that one slow connect does not hold up the other nodes), started on first
/// need. Dropping it closes its channel: the thread ends after its current connect
/// (bounded by the connect timeout); [`ConnectWorker::stop`] also waits for that.
struct Worker {
    jobs: crossbeam_channel::Sender<Job>,
    thread: std::thread::JoinHandle<()>,
}

/// The connect worker of one server, started on first need.
#[derive(Default)]
pub(crate) struct ConnectWorker(Mutex<Option<Worker>>);

impl ConnectWorker {
    /// Runs `job` on this node's connect worker (started if need be). If the thread
    /// cannot be started, the job is dropped unrun: its caller waits until its deadline.
    pub(crate) fn spawn(&self, server: &dyn std::fmt::Display, job: Job) {
        let mut worker = self.0.lock();
        if worker.as_ref().is_none_or(|w| w.thread.is_finished()) {
            let (jobs, rx) = crossbeam_channel::unbounded::<Job>();
            let spawned = std::thread::Builder::new()
                .name("dlm-redis-connect".into())
                .spawn(move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                });
            match spawned {
                Ok(thread) => *worker = Some(Worker { jobs, thread }),
                Err(e) => {
                    log::error!("{}: cannot start a connect worker: {e}", server);
                    return;
                }
            }
        }
        if let Some(w) = worker.as_ref() {
            let _ = w.jobs.send(job);
        }
    }

    /// Whether this node's connect worker is running.
    pub(crate) fn running(&self) -> bool {
        self.0
            .lock()
            .as_ref()
            .is_some_and(|w| !w.thread.is_finished())
    }

    /// Stops the connect worker, waiting for its current connect (unless called on it).
    pub(crate) fn stop(&self) {
        let worker = self.0.lock().take();
        if let Some(Worker { jobs, thread }) = worker {
            drop(jobs);
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}
