//! `dlm completions SHELL` and `dlm man [SUBCOMMAND]`: generated from the same clap
//! definitions as `--help`, printed on standard output (nothing is installed).

use std::io::Write;

use clap::{Args, CommandFactory};

use crate::exit::{self, Failure};

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_name = "SHELL", value_enum)]
    shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub(crate) struct ManArgs {
    /// A subcommand's page (dlm-run(1), ...) instead of dlm(1).
    #[arg(value_name = "SUBCOMMAND")]
    subcommand: Option<String>,
}

/// The command line as clap builds it (names and bin names of the subcommands set),
/// without the `help` subcommand, which has no page of its own.
fn command() -> clap::Command {
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The visible subcommands: those a completion script and the manual name.
fn subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set())
}

/// `dlm completions SHELL`.
pub(crate) fn completions(args: &CompletionsArgs) -> Result<u8, Failure> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut crate::Cli::command(), "dlm", &mut out);
    print(&out)
}

/// `dlm man [SUBCOMMAND]`.
pub(crate) fn man(args: &ManArgs) -> Result<u8, Failure> {
    let cmd = command();
    let page = match &args.subcommand {
        None => cmd,
        Some(name) => match subcommands(&cmd).find(|s| s.get_name() == name) {
            Some(sub) => sub.clone(),
            None => {
                let names: Vec<&str> = subcommands(&cmd).map(clap::Command::get_name).collect();
                return Err(Failure::usage(format!(
                    "dlm man: no subcommand {name:?} (one of: {})",
                    names.join(", ")
                )));
            }
        },
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot render the manual: {e}")))?;
    print(&out)
}

/// Writes `bytes` to standard output.
fn print(bytes: &[u8]) -> Result<u8, Failure> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(0),
        // Nobody reads (`dlm man | head`): nothing to say.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        Err(e) => Err(Failure::new(
            exit::OS_ERROR,
            format!("cannot write to standard output: {e}"),
        )),
    }
}
