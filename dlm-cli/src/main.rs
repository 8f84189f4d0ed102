//! `dlm`: runs a command under a distributed lock on Redis (one server, Sentinel, Cluster,
//! Redlock), etcd or PostgreSQL, for cron jobs, batch jobs and shell scripts (`flock(1)`
//! across machines): a lock, one of N permits of a semaphore, or a read or write hold of a
//! read-write lock. See `dlm --help` and the README.

mod backend;
mod docs;
mod exit;
mod hold;
mod leader;
mod logger;
mod run;
mod status;

use clap::{Args, Parser, Subcommand};

use crate::backend::Connection;

const EXAMPLES: &str = "\
Examples:
  # cron: run the nightly export once across all machines; skip if it already runs
  dlm run -n nightly-export -- /usr/local/bin/export --all

  # wait at most 60 s for the lock, then give up with status 75
  dlm run -w 60 -E 75 reindex -c 'make reindex && make publish'

  # Redlock over three independent masters; password from a file, not the command line
  DLM_REDIS_URL=redis://10.0.0.1,redis://10.0.0.2,redis://10.0.0.3 \\
    dlm run --password-file /etc/dlm/password report -- ./report.sh

  # on a Redis Cluster (any node as a seed), or behind Sentinel (the master named mymaster);
  # --wait-replicas 1: a grant no replica acknowledged is undone
  dlm run --cluster --redis redis://10.0.1.1:6379,redis://10.0.1.2:6379 backup -- ./backup.sh
  dlm run --sentinel mymaster --redis redis://10.0.2.1:26379,redis://10.0.2.2:26379 \\
    --wait-replicas 1 --password-file /etc/dlm/password backup -- ./backup.sh

  # on an etcd cluster
  dlm run --etcd http://10.0.3.1:2379,http://10.0.3.2:2379,http://10.0.3.3:2379 backup -- ./backup.sh

  # on PostgreSQL: a primary and its standby (dlm uses the one that accepts writes)
  dlm run --postgres postgresql://dlm@10.0.4.1:5432,10.0.4.2:5432/app backup -- ./backup.sh

  # at most 3 exports at once across all machines (a semaphore of 3 permits; every
  # run gives the same count)
  dlm run --permits 3 exports -- ./export.sh

  # readers together, a writer alone: the read-write lock config (not the lock config)
  dlm run --shared config -- ./read-config.sh
  dlm run --exclusive config -- ./rewrite-config.sh

  # is it held, and for how long? Who holds the permits or the read-write lock?
  dlm status nightly-export reindex --json
  dlm status --permits 3 exports; dlm status --rw config
  # one scheduler across the machines, the others waiting as candidates; who leads?
  dlm run --elect --value 10.0.0.7:8080 scheduler -- ./scheduler
  dlm leader scheduler; dlm leader --watch --json scheduler

  # clear a semaphore or a read-write lock whoever holds it
  dlm unlock --force --permits exports; dlm unlock --force --rw config

Exit status (sysexits(3) codes where one has the meaning; 1 and 70 are dlm's own):
  0      the command succeeded (or: status, leader and unlock succeeded)
  N      the command's own status; 128+N when it was killed by signal N (or a signal
         ended dlm's wait for the lock)
  1      the lock was not obtained (-n, -w), as flock(1): change with
         -E/--conflict-exit-code; dlm leader: nobody leads; dlm unlock: not confirmed
  64     usage error (EX_USAGE): bad arguments, a bad URL, name or label, no command, no
         backend; a backend without semaphores, read-write locks or elections (Redlock)
  69     the backend failed (EX_UNAVAILABLE): unreachable, no quorum, TLS refused
  70     the lock was lost while the command ran (the command was stopped): dlm's own
         meaning, not EX_SOFTWARE's
  71     dlm could not start a thread, handle signals or wait for the command (EX_OSERR)
  77     the backend refused the credentials or a permission (EX_NOPERM)
  78     the semaphore is held with another --permits count (EX_CONFIG)
  126    the command cannot be executed; 127: the command was not found

Environment (each option's variable is also named under its option):
  DLM_REDIS_URL          --redis: one URL or several, comma-separated
  DLM_ETCD_ENDPOINTS     --etcd: etcd members, comma-separated
  DLM_POSTGRES_URL       --postgres: a PostgreSQL URL
  DLM_TLS_CA_FILE, DLM_TLS_CERT, DLM_TLS_KEY, DLM_TLS_SERVER_NAME
                         --tls-ca-file, --tls-cert, --tls-key, --tls-server-name
  DLM_PASSWORD           the password for URLs that have none, on every backend (never
                         shown anywhere); --password-file goes first
  DLM_REDIS_PASSWORD     Redis's, read before DLM_PASSWORD (its older name; etcd reads it
                         last)
  DLM_ETCD_PASSWORD      etcd's, read before DLM_PASSWORD
  DLM_POSTGRES_PASSWORD  PostgreSQL's, read before DLM_PASSWORD (then libpq's PGPASSWORD)
  A flag goes before its variable. Without a backend flag, set only one of DLM_REDIS_URL,
  DLM_ETCD_ENDPOINTS and DLM_POSTGRES_URL.
  The command gets DLM_LOCK_NAME, DLM_FENCING_TOKEN (with fencing) and DLM_LEASE_MS, and
  not dlm's secrets: the password variables, and DLM_REDIS_URL, DLM_ETCD_ENDPOINTS or
  DLM_POSTGRES_URL when a URL in it has a password.";

const HOLD_EXAMPLES: &str = "\
Output: one line, DLM_LOCK_NAME='NAME' DLM_FENCING_TOKEN=N DLM_LEASE_MS=N (the token empty
without fencing), for eval. Nothing when the lock was not obtained.

Examples:
  # bash: hold a lock across several commands; closing the pipe releases it
  coproc HOLD { dlm hold -w 60 deploy; }
  read -r vars <&\"${HOLD[0]}\" || exit 1    # nothing: not obtained (see the exit status)
  eval \"$vars\"
  ./migrate --fencing-token \"$DLM_FENCING_TOKEN\" && ./restart
  exec {HOLD[1]}>&-; wait $HOLD_PID      # release; 0, or 70 if the lock was lost

  # any reader: the lock is released when fd 3 is closed (or the script exits)
  exec 3< <(dlm hold -n nightly </dev/null)
  read -r vars <&3 || exit 1
  ...
  exec 3<&-

Ends: standard input at its end (a pipe, a socket, or Ctrl-D on a terminal; a file or
/dev/null is not watched), standard output's reader gone (a pipe or a socket), or SIGTERM,
SIGINT, SIGHUP, SIGQUIT (exit 128+N). Exit status as dlm run's (see dlm --help): 0
released at the end of input, 1 (-E) not obtained, 64 usage error, 69 backend failed,
70 the lock was lost (its lease ran out unrenewed), 77 credentials refused, 78 another
--permits count in use.";

const COMPLETIONS_HELP: &str = "\
Examples (nothing is installed: redirect the script to where your shell looks):
  dlm completions bash > ~/.local/share/bash-completion/completions/dlm
  dlm completions zsh > ~/.zfunc/_dlm     # with fpath+=(~/.zfunc) before compinit
  dlm completions fish > ~/.config/fish/completions/dlm.fish";

const MAN_HELP: &str = "\
Examples (nothing is installed):
  dlm man > dlm.1 && man ./dlm.1
  dlm man run | man -l -
  mkdir -p ~/.local/share/man/man1 && dlm man > ~/.local/share/man/man1/dlm.1";

/// Runs a command under a distributed lock on Redis (single instance, Sentinel, Cluster or
/// Redlock), etcd or PostgreSQL, or under a lock between the processes of this machine
/// (--local): a lock, a permit of a semaphore, a read or write hold, or an election's lead.
#[derive(Debug, Parser)]
#[command(name = "dlm", version, after_long_help = EXAMPLES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire NAME, run a command while holding it, release when it exits.
    #[command(after_long_help = EXAMPLES)]
    Run(run::RunArgs),
    /// Acquire NAME and print it as shell assignments; keep it (renewed) until standard
    /// input ends, standard output's reader goes, or SIGTERM/SIGINT; then release it.
    #[command(after_long_help = HOLD_EXAMPLES)]
    Hold(hold::HoldArgs),
    /// Whether each NAME is held, and the remaining lease (with --permits or --rw: the
    /// holders of a semaphore or read-write lock, each with its label and lease, and the
    /// count a semaphore is held with).
    Status(status::StatusArgs),
    /// Who leads the election NAME (`dlm run --elect NAME`): its value and term; exit 1
    /// when nobody leads. --watch: a line at every change.
    Leader(leader::LeaderArgs),
    /// Release NAME whoever holds it (administration; --permits or --rw: every hold of
    /// the semaphore or read-write lock NAME).
    Unlock(status::UnlockArgs),
    /// Print a completion script for SHELL on standard output (bash, zsh, fish, elvish,
    /// powershell).
    #[command(after_long_help = COMPLETIONS_HELP)]
    Completions(docs::CompletionsArgs),
    /// Print dlm's manual page (roff, section 1) on standard output, or SUBCOMMAND's.
    #[command(after_long_help = MAN_HELP)]
    Man(docs::ManArgs),
    /// Internal: becomes the command (after setting the parent-death signal).
    #[command(name = "__exec", hide = true)]
    Exec(run::ExecArgs),
}

impl Command {
    /// The backend arguments, for the subcommands that take them.
    fn backend_mut(&mut self) -> Option<&mut BackendArgs> {
        match self {
            Command::Run(a) => Some(&mut a.backend),
            Command::Hold(a) => Some(&mut a.backend),
            Command::Status(a) => Some(&mut a.backend),
            Command::Leader(a) => Some(&mut a.backend),
            Command::Unlock(a) => Some(&mut a.backend),
            Command::Completions(_) | Command::Man(_) | Command::Exec(_) => None,
        }
    }
}

/// Where the locks are: shared by every subcommand.
#[derive(Debug, Args)]
struct BackendArgs {
    /// Redis URL(s), comma-separated: one for a single instance, three or more for
    /// Redlock over independent masters (two are refused: either one down would stop
    /// every lock). A password here is visible in `ps`: prefer --password-file or
    /// $DLM_PASSWORD.
    #[arg(long, value_name = "URL[,URL...]", env = backend::URL_VAR, hide_env_values = true)]
    redis: Option<String>,
    /// etcd member client URL(s), comma-separated (http://host:2379; one is enough,
    /// more give failover): the locks live in etcd's Raft log. With etcd auth, the user
    /// goes in the URL (http://USER@host:2379) and the password comes from
    /// --password-file, $DLM_ETCD_PASSWORD, $DLM_PASSWORD (else $DLM_REDIS_PASSWORD) or
    /// the URL. Not with --redis, --postgres or the Redis options.
    #[arg(long, value_name = "URL[,URL...]", env = backend::ETCD_VAR, hide_env_values = true)]
    etcd: Option<String>,
    /// A PostgreSQL URL (postgresql://USER@host:5432/DATABASE, libpq's form; several
    /// hosts, host1:5432,host2:5432, for a primary and its standbys: dlm uses the one that
    /// accepts writes): the locks live in rows of the schema dlm (see --prefix). A password
    /// here is visible in `ps`: prefer --password-file, $DLM_POSTGRES_PASSWORD or
    /// $DLM_PASSWORD (for a URL without one; else libpq's $PGPASSWORD). Not with --redis,
    /// --etcd or the Redis options.
    #[arg(long, value_name = "URL", env = backend::POSTGRES_VAR, hide_env_values = true)]
    postgres: Option<String>,
    /// Locks between the processes of this machine only, with no server: flock(2) on
    /// files of a directory (--dir, else $XDG_RUNTIME_DIR/dlm, /run/lock/dlm for root,
    /// /tmp/dlm-UID otherwise; made 0700). A command with no backend option never takes
    /// one silently: it is a usage error. Not with --redis, --etcd or --postgres.
    #[arg(long)]
    local: bool,
    /// The directory of --local's locks (implies --local).
    #[arg(long, value_name = "DIR", env = backend::DIR_VAR, value_parser = backend::path)]
    dir: Option<std::path::PathBuf>,
    /// The URLs are seed nodes of a Redis Cluster (one is enough; more in case one is
    /// down): each lock lives on the master of its hash slot.
    #[arg(long, conflicts_with = "sentinel")]
    cluster: bool,
    /// The URLs are Redis Sentinels (with their own password, if any, in the URLs); the
    /// lock lives on the master they name NAME. The password of --password-file or
    /// $DLM_PASSWORD is then the data nodes'.
    #[arg(long, value_name = "NAME")]
    sentinel: Option<String>,
    /// After each grant and renewal, wait until N replicas acknowledged it (Redis
    /// WAIT); a grant they did not acknowledge in time is undone and retried. Narrows what
    /// a failover can lose; not a consensus (see the README). Not for Redlock.
    #[arg(long, value_name = "N")]
    wait_replicas: Option<u32>,
    /// How long --wait-replicas waits for the acknowledgements, in seconds (default 0.5;
    /// under 1, the reply deadline).
    #[arg(long, value_name = "SECS", requires = "wait_replicas")]
    wait_timeout: Option<f64>,
    /// A file whose first line is the password for URLs that have none (before the
    /// password variables: see Environment in dlm --help).
    #[arg(long, value_name = "FILE")]
    password_file: Option<std::path::PathBuf>,
    /// For rediss:// and https:// URLs, and --postgres (a TLS option makes it require
    /// TLS): a PEM file of CA certificates to trust instead of the system's. Also
    /// --cacert, etcdctl's and redis-cli's name.
    #[arg(long, value_name = "FILE", visible_alias = "cacert", env = "DLM_TLS_CA_FILE", hide_env_values = true,
          value_parser = backend::path)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// For rediss:// and https:// URLs and --postgres: a PEM client certificate chain
    /// (mutual TLS); needs --tls-key. Also --cert.
    #[arg(long, value_name = "FILE", visible_alias = "cert", env = "DLM_TLS_CERT", hide_env_values = true,
          value_parser = backend::path, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// For rediss:// and https:// URLs and --postgres: the PEM private key of --tls-cert.
    /// Also --key.
    #[arg(long, value_name = "FILE", visible_alias = "key", env = "DLM_TLS_KEY", hide_env_values = true,
          value_parser = backend::path, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// For rediss:// and https:// URLs and --postgres: the name to verify in the server's
    /// certificate, when it is not the URL's host.
    #[arg(
        long,
        value_name = "NAME",
        env = "DLM_TLS_SERVER_NAME",
        hide_env_values = true
    )]
    tls_server_name: Option<String>,
    /// The prefix of dlm's keys (default: dlm on Redis, dlm/ on etcd), or on PostgreSQL
    /// the schema of its tables (default: dlm): locks under another prefix are other
    /// locks.
    #[arg(long, value_name = "PREFIX")]
    prefix: Option<String>,
    /// More messages on stderr (-v: what dlm does, -vv: the library's debug messages).
    /// Passwords never appear.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// No status line while waiting, and only errors on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// The options above whose value came from their environment variable (filled in
    /// after parsing), so that a message names what the user set.
    #[arg(skip)]
    from_env: Vec<&'static str>,
}

impl BackendArgs {
    /// The ids of the options that have an environment variable.
    const WITH_ENV: [&'static str; 8] = [
        "redis",
        "etcd",
        "postgres",
        "dir",
        "tls_ca_file",
        "tls_cert",
        "tls_key",
        "tls_server_name",
    ];

    /// Notes which options took their value from the environment. A TLS variable set to
    /// nothing is taken as not set (as the backend variables are, see `backend::choose`).
    fn note_sources(&mut self, matches: &clap::ArgMatches) {
        self.from_env = Self::WITH_ENV
            .into_iter()
            .filter(|id| matches.value_source(id) == Some(clap::parser::ValueSource::EnvVariable))
            .collect();
        let from_env = self.from_env.clone();
        let empty = |id: &str, value: &std::ffi::OsStr| from_env.contains(&id) && value.is_empty();
        for (id, value) in [
            ("tls_ca_file", &mut self.tls_ca_file),
            ("tls_cert", &mut self.tls_cert),
            ("tls_key", &mut self.tls_key),
        ] {
            if value.as_ref().is_some_and(|v| empty(id, v.as_os_str())) {
                *value = None;
            }
        }
        if self
            .tls_server_name
            .as_ref()
            .is_some_and(|v| empty("tls_server_name", v.as_ref()))
        {
            self.tls_server_name = None;
        }
    }

    /// Whether option `id` (its field's name) took its value from its variable.
    fn is_from_env(&self, id: &str) -> bool {
        self.from_env.contains(&id)
    }
}

/// Parses the command line (and the options' variables). A usage error exits 64
/// (EX_USAGE), as dlm's own usage errors do, not clap's 2; `--help` and `--version` exit
/// 0.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let parsed = Cli::command().try_get_matches().and_then(|matches| {
        let mut cli = Cli::from_arg_matches(&matches)?;
        if let (Some(backend), Some((_, sub))) = (cli.command.backend_mut(), matches.subcommand()) {
            backend.note_sources(sub);
        }
        Ok(cli)
    });
    parsed.unwrap_or_else(|e| {
        use clap::error::ErrorKind;
        if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            e.exit()
        }
        let _ = e.print();
        std::process::exit(i32::from(exit::USAGE))
    })
}

fn main() {
    let cli = parse();
    let outcome = match cli.command {
        Command::Run(args) => {
            logger::init(args.backend.verbose, args.backend.quiet);
            // `run` exits the process itself once the lock is released.
            match run::check(&args).and_then(|_| Connection::from_args(&args.backend)) {
                Ok(c) => run::run(&c, &args),
                Err(e) => Err(e),
            }
        }
        Command::Hold(args) => {
            logger::init(args.backend.verbose, args.backend.quiet);
            hold::check(&args)
                .and_then(|_| Connection::from_args(&args.backend))
                .and_then(|c| hold::hold(&c, &args))
        }
        Command::Status(args) => {
            logger::init(args.backend.verbose, args.backend.quiet);
            Connection::from_args(&args.backend).and_then(|c| status::status(&c, &args))
        }
        Command::Leader(args) => {
            logger::init(args.backend.verbose, args.backend.quiet);
            Connection::from_args(&args.backend).and_then(|c| leader::leader(&c, &args))
        }
        Command::Unlock(args) => {
            logger::init(args.backend.verbose, args.backend.quiet);
            Connection::from_args(&args.backend).and_then(|c| status::unlock(&c, &args))
        }
        Command::Completions(args) => docs::completions(&args),
        Command::Man(args) => docs::man(&args),
        Command::Exec(args) => run::exec(&args),
    };
    exit::now(outcome)
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks of the arguments (they run at parse time in debug
    /// builds only).
    #[test]
    fn the_arguments_are_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
