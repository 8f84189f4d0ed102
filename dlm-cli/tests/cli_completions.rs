//! `dlm completions SHELL` and `dlm man [SUBCOMMAND]` from the real binary: the scripts
//! parse in their shell and complete dlm's subcommands and options, the manual pages
//! render with man(1) and groff and say what `--help` says. A shell or tool this machine
//! lacks is said with `#[ignore]` on the test that needs it (run those with `--ignored`
//! where it is installed: they fail, not pass, without it).

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{dlm, run};

/// The visible subcommands (`dlm --help`'s list, `help` aside).
const SUBCOMMANDS: [&str; 7] = [
    "run",
    "hold",
    "status",
    "leader",
    "unlock",
    "completions",
    "man",
];

/// `dlm ARGS`, which must succeed with nothing on stderr: its stdout.
fn output(args: &[&str]) -> String {
    let done = run(dlm().args(args));
    done.expect(0);
    assert!(done.stderr.is_empty(), "{args:?}: {}", done.stderr);
    assert!(!done.stdout.is_empty(), "{args:?} printed nothing");
    done.stdout
}

/// Runs `program` with `args` (stdin null), which must exist: its status, stdout and
/// stderr.
fn tool(program: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} (is it installed?): {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `dlm completions SHELL` into a file.
fn script(dir: &Path, shell: &str) -> (std::path::PathBuf, String) {
    let text = output(&["completions", shell]);
    let path = dir.join(format!("dlm.{shell}"));
    std::fs::write(&path, &text).unwrap();
    (path, text)
}

/// The subcommands `dlm --help` lists agree with [`SUBCOMMANDS`] (so the tests below
/// cover every one).
#[test]
fn the_subcommand_list_is_dlms() {
    let help = output(&["--help"]);
    for sub in SUBCOMMANDS {
        assert!(
            help.lines().any(|l| l.starts_with(&format!("  {sub} "))),
            "{sub} is not in dlm --help:\n{help}"
        );
    }
    let listed = help
        .split_once("\nCommands:\n")
        .unwrap()
        .1
        .lines()
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .count();
    // Plus clap's own `help`.
    assert_eq!(listed, SUBCOMMANDS.len() + 1, "{help}");
}

/// The bash script parses (`bash -n`), and completes: the subcommands after `dlm`, and
/// the options of `dlm run` (with their aliases) after `dlm run --`.
#[test]
fn the_bash_completion_parses_and_completes_subcommands_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = script(dir.path(), "bash");
    let path = path.to_str().unwrap();
    let (code, _, err) = tool("bash", &["-n", path], &[]);
    assert_eq!(code, 0, "bash -n: {err}");
    // What bash's completion would offer for a line: the function the script registers
    // for `dlm`, called as bash calls it.
    let complete = |words: &[&str]| -> Vec<String> {
        let line = words.join(" ");
        let array: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let probe = format!(
            "source '{path}'\n\
             f=$(complete -p dlm | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
             [ -n \"$f\" ] || {{ echo 'no completion registered for dlm' >&2; exit 3; }}\n\
             COMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n\
             \"$f\" dlm '{cur}' '{prev}'\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            words = array.join(" "),
            cword = words.len() - 1,
            cur = words[words.len() - 1],
            prev = words[words.len() - 2],
        );
        let (code, out, err) = tool("bash", &["-c", &probe], &[]);
        assert_eq!(code, 0, "{words:?}: {err}");
        out.lines().map(str::to_owned).collect()
    };
    let subs = complete(&["dlm", ""]);
    for sub in SUBCOMMANDS {
        assert!(subs.iter().any(|s| s == sub), "{sub} not offered: {subs:?}");
    }
    let options = complete(&["dlm", "run", "--"]);
    for option in [
        "--redis",
        "--etcd",
        "--postgres",
        "--no-wait",
        "--tls-ca-file",
        "--cacert",
        "--cert",
        "--key",
        "--permits",
    ] {
        assert!(
            options.iter().any(|o| o == option),
            "{option} not offered: {options:?}"
        );
    }
    let shells = complete(&["dlm", "completions", ""]);
    for shell in ["bash", "zsh", "fish"] {
        assert!(shells.iter().any(|s| s == shell), "{shells:?}");
    }
}

/// The zsh and fish scripts are for `dlm` and name every subcommand and the TLS aliases
/// (their syntax is checked by the tests below, with the shells).
#[test]
fn the_zsh_and_fish_completions_name_every_subcommand() {
    for (shell, head) in [("zsh", "#compdef dlm"), ("fish", "complete -c dlm")] {
        let text = output(&["completions", shell]);
        assert!(text.contains(head), "{shell}: {text}");
        for word in SUBCOMMANDS
            .iter()
            .chain(&["tls-ca-file", "cacert", "cert", "key"])
        {
            assert!(text.contains(word), "{shell}: {word} missing");
        }
    }
}

#[test]
#[ignore = "needs zsh, which this machine does not have; run with --ignored where it is installed"]
fn the_zsh_completion_parses() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = script(dir.path(), "zsh");
    let (code, _, err) = tool("zsh", &["-n", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "zsh -n: {err}");
}

#[test]
#[ignore = "needs fish, which this machine does not have; run with --ignored where it is installed"]
fn the_fish_completion_parses() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = script(dir.path(), "fish");
    let (code, _, err) = tool("fish", &["--no-execute", path.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "fish --no-execute: {err}");
}

/// A completion for a shell dlm does not know, or none: a usage error (64).
#[test]
fn completions_for_an_unknown_shell_are_a_usage_error() {
    for args in [&["completions", "tcsh"][..], &["completions"]] {
        let done = run(dlm().args(args));
        done.expect(64);
        assert!(done.stderr.starts_with("error: "), "{}", done.stderr);
    }
}

/// `dlm man` renders with man(1) (`man -l`), without a warning from groff (`-ww`), and
/// says what `dlm --help` says: the subcommands, the exit statuses, the environment.
/// `dlm man SUBCOMMAND` is that subcommand's page, with its options and variables.
#[test]
fn the_manual_pages_render_and_say_what_help_says() {
    let dir = tempfile::tempdir().unwrap();
    let render = |args: &[&str], name: &str| -> String {
        let roff = output(args);
        assert!(roff.contains(".TH "), "{args:?}: no title: {roff}");
        let path = dir.path().join(format!("{name}.1"));
        std::fs::write(&path, &roff).unwrap();
        let path = path.to_str().unwrap();
        let (code, _, err) = tool("groff", &["-man", "-ww", "-z", path], &[]);
        assert_eq!(code, 0, "groff: {err}");
        assert!(err.is_empty(), "{args:?}: groff warns: {err}");
        let (code, page, err) = tool(
            "man",
            // No hyphenation or justification: words stay whole for the checks.
            &["--nh", "--nj", "-l", path],
            &[("MANPAGER", "cat"), ("PAGER", "cat"), ("MANWIDTH", "100")],
        );
        assert_eq!(code, 0, "man -l {path}: {err}");
        page
    };
    let page = render(&["man"], "dlm");
    for word in SUBCOMMANDS.iter().map(|s| format!("dlm-{s}(1)")).chain([
        "EX_USAGE".to_owned(),
        "DLM_REDIS_URL".to_owned(),
        "DLM_PASSWORD".to_owned(),
    ]) {
        assert!(page.contains(&word), "dlm(1) lacks {word}:\n{page}");
    }
    for sub in SUBCOMMANDS {
        let page = render(&["man", sub], &format!("dlm-{sub}"));
        assert!(page.contains(&format!("dlm-{sub}")), "{sub}: {page}");
        if sub != "completions" && sub != "man" {
            for word in ["--tls-ca-file", "DLM_TLS_CA_FILE", "--cacert"] {
                assert!(page.contains(word), "dlm-{sub}(1) lacks {word}:\n{page}");
            }
        }
    }
    let done = run(dlm().args(["man", "nope"]));
    done.expect(64);
    assert!(
        done.stderr.contains("no subcommand \"nope\""),
        "{}",
        done.stderr
    );
}
