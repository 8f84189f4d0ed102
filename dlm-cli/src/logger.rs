//! A minimal `log` logger on stderr: `dlm: warning: ...`.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr {
    /// dlm's own messages show from -v.
    own: LevelFilter,
    /// The library's debug messages need -vv.
    library: LevelFilter,
}

impl Log for Stderr {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let target = metadata.target();
        let own = env!("CARGO_CRATE_NAME");
        let limit = if target == own
            || target
                .strip_prefix(own)
                .is_some_and(|rest| rest.starts_with("::"))
        {
            self.own
        } else if target == dlm_redis::SETTINGS_LOG_TARGET {
            // The server-settings warnings would come with every run: shown with -v.
            if self.own >= LevelFilter::Info {
                LevelFilter::Warn
            } else {
                LevelFilter::Off
            }
        } else if target.starts_with("tokio_postgres") {
            // The PostgreSQL driver's debug lines are the statements (the whole schema
            // at first use) and its info lines the server's notices ("already exists,
            // skipping"): only its warnings show.
            self.library.min(LevelFilter::Warn)
        } else {
            self.library
        };
        metadata.level() <= limit
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        eprintln!("dlm: {level}: {}", record.args());
    }

    fn flush(&self) {}
}

/// Installs the logger: warnings by default, errors only with `quiet`, dlm's progress
/// with `-v`, the library's debug messages with `-vv`.
pub(crate) fn init(verbose: u8, quiet: bool) {
    let (own, library) = match (quiet, verbose) {
        (true, _) => (LevelFilter::Error, LevelFilter::Error),
        (false, 0) => (LevelFilter::Warn, LevelFilter::Warn),
        (false, 1) => (LevelFilter::Info, LevelFilter::Warn),
        (false, _) => (LevelFilter::Debug, LevelFilter::Debug),
    };
    let logger: &'static Stderr = Box::leak(Box::new(Stderr { own, library }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(own.max(library));
    }
}
