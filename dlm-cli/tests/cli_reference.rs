//! `docs/guide/command-reference.md` is the `--help` of `dlm` and of every subcommand, as
//! the real binary prints it: this test renders it and fails when the checked-in file
//! differs (regenerate it with `DLM_BLESS=1 cargo test -p dlm-cli --test cli_reference`).
//! So the reference, `dlm --help` and the manual page (`dlm man`, from the same clap
//! definitions) always agree.

mod common;

use std::path::PathBuf;

use common::{dlm, run};

/// How to regenerate the file.
const BLESS: &str = "DLM_BLESS=1 cargo test -p dlm-cli --test cli_reference";

/// The width the reference is wrapped at (clap reads `COLUMNS` when its output is no
/// terminal).
const COLUMNS: &str = "100";

fn reference_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/guide/command-reference.md")
}

/// `dlm ARGS --help`, as a user sees it in a 100-column terminal.
fn help(args: &[&str]) -> String {
    let done = run(dlm().env("COLUMNS", COLUMNS).args(args).arg("--help"));
    done.expect(0);
    assert!(done.stderr.is_empty(), "{args:?}: {}", done.stderr);
    done.stdout
}

/// The subcommands `dlm --help` lists (its `Commands:` section), but `help`.
fn subcommands(top: &str) -> Vec<String> {
    let section = top
        .split_once("\nCommands:\n")
        .map(|(_, rest)| rest)
        .expect("dlm --help has a Commands: section");
    let names: Vec<String> = section
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    names
}

/// The whole reference, rendered from the binary.
fn render() -> String {
    let top = help(&[]);
    let mut out = format!(
        "# `dlm` command reference\n\n\
         <!-- Generated from dlm's own --help: do not edit. Regenerate with\n     {BLESS}\n     \
         (dlm-cli/tests/cli_reference.rs checks that this file is up to date). -->\n\n\
         The `--help` of `dlm` and of each subcommand, as dlm prints it. The guide, with \
         examples, the exit statuses and the environment: [The `dlm` command](command.md).\n\n"
    );
    let names = subcommands(&top);
    out.push_str("Contents: [`dlm`](#dlm)");
    for name in &names {
        out.push_str(&format!(", [`dlm {name}`](#dlm-{name})"));
    }
    out.push_str("\n\n## `dlm`\n\n```text\n$ dlm --help\n");
    out.push_str(&top);
    out.push_str("```\n");
    for name in &names {
        out.push_str(&format!(
            "\n## `dlm {name}`\n\n```text\n$ dlm {name} --help\n"
        ));
        out.push_str(&help(&[name]));
        out.push_str("```\n");
    }
    out
}

#[test]
fn the_command_reference_is_dlms_own_help() {
    let want = render();
    let path = reference_path();
    if std::env::var_os("DLM_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/guide/command-reference.md is not what dlm --help prints (first difference at \
             line {}:\n  file: {:?}\n  dlm:  {:?}).\nRegenerate it with: {BLESS}",
            line + 1,
            have.lines().nth(line).unwrap_or("(end of file)"),
            want.lines().nth(line).unwrap_or("(end of output)"),
        );
    }
}

/// Every subcommand's help is in the reference, and every option of `dlm run` that has an
/// environment variable names it (the variable's value, which may hold a password, never
/// shows, even when it is set).
#[test]
fn every_variable_is_named_under_its_option_and_no_value_shows() {
    let secret = "Help-Secret-Pa55";
    let done = run(dlm()
        .env("COLUMNS", COLUMNS)
        .env("DLM_REDIS_URL", format!("redis://:{secret}@127.0.0.1:1"))
        .env(
            "DLM_ETCD_ENDPOINTS",
            format!("http://u:{secret}@127.0.0.1:1"),
        )
        .env(
            "DLM_POSTGRES_URL",
            format!("postgresql://u:{secret}@127.0.0.1:1/db"),
        )
        .env("DLM_TLS_CA_FILE", format!("/{secret}/ca.pem"))
        .env("DLM_TLS_CERT", format!("/{secret}/cert.pem"))
        .env("DLM_TLS_KEY", format!("/{secret}/key.pem"))
        .env("DLM_TLS_SERVER_NAME", secret)
        .env("DLM_PASSWORD", secret)
        .args(["run", "--help"]));
    done.expect(0);
    let help = &done.stdout;
    assert!(!help.contains(secret), "a value shows:\n{help}");
    for (option, var) in [
        ("--redis", "DLM_REDIS_URL"),
        ("--etcd", "DLM_ETCD_ENDPOINTS"),
        ("--postgres", "DLM_POSTGRES_URL"),
        ("--tls-ca-file", "DLM_TLS_CA_FILE"),
        ("--tls-cert", "DLM_TLS_CERT"),
        ("--tls-key", "DLM_TLS_KEY"),
        ("--tls-server-name", "DLM_TLS_SERVER_NAME"),
    ] {
        let entry = entry(help, option);
        assert!(
            entry.contains(&format!("[env: {var}]")),
            "{option} does not name {var}:\n{entry}"
        );
    }
    for alias in ["--cacert", "--cert", "--key"] {
        assert!(
            help.contains(&format!("[alias: {alias}]")),
            "no alias {alias}:\n{help}"
        );
    }
    // The variables without an option (passwords) are in the Environment section.
    for var in [
        "DLM_PASSWORD",
        "DLM_REDIS_PASSWORD",
        "DLM_ETCD_PASSWORD",
        "DLM_POSTGRES_PASSWORD",
    ] {
        assert!(help.contains(&format!("\n  {var} ")), "{var}:\n{help}");
    }
}

/// An option's entry in a long help: from its line to the next option's.
fn entry(help: &str, option: &str) -> String {
    let is_option = |l: &str| {
        let t = l.trim_start();
        t.starts_with('-') && l.len() - t.len() <= 6
    };
    let lines: Vec<&str> = help.lines().collect();
    let start = lines
        .iter()
        .position(|l| is_option(l) && l.contains(&format!("{option} ")))
        .unwrap_or_else(|| panic!("no {option} in:\n{help}"));
    let end = lines[start + 1..]
        .iter()
        .position(|l| is_option(l))
        .map_or(lines.len(), |i| start + 1 + i);
    lines[start..end].join("\n")
}
