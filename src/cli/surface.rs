//! The command line's user-visible surface, pinned: every flag of every command with its
//! environment variable, default, arity, accepted values, conflicts and requirements. Help
//! text, headings and value placeholders are left out on purpose: they may be reworded, the
//! rest may not change without a deliberate edit of `surface.txt`.
//!
//! After a deliberate change, rewrite the file with
//! `KUBE_WS_PROXY_BLESS_CLI_SURFACE=1 cargo test --release --lib cli::surface` and review the
//! diff.

use std::fmt::Write as _;

use clap::CommandFactory;

use super::Cli;

const PINNED: &str = include_str!("surface.txt");
const BLESS: &str = "KUBE_WS_PROXY_BLESS_CLI_SURFACE";

/// One line per flag, commands in the order clap lists them, flags sorted by long name.
fn render() -> String {
    let mut root = Cli::command();
    root.build();
    let mut out = String::new();
    render_command(&root, "kube-ws-proxy", &mut out);
    out
}

fn render_command(cmd: &clap::Command, path: &str, out: &mut String) {
    let mut args: Vec<&clap::Arg> = cmd.get_arguments().collect();
    args.sort_by_key(|a| a.get_long().unwrap_or(a.get_id().as_str()).to_owned());
    for arg in args {
        let _ = writeln!(out, "{path} {}", describe(cmd, arg));
    }
    for sub in cmd.get_subcommands() {
        render_command(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

fn describe(cmd: &clap::Command, arg: &clap::Arg) -> String {
    let list = |items: Vec<String>| format!("[{}]", items.join(","));
    let mut conflicts: Vec<String> = cmd
        .get_arg_conflicts_with(arg)
        .iter()
        .map(|a| a.get_id().to_string())
        .collect();
    conflicts.sort();
    let defaults = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    let values = arg
        .get_possible_values()
        .iter()
        .map(|v| v.get_name().to_owned())
        .collect();
    format!(
        "--{long} id={id} short={short:?} env={env} default={defaults} action={action:?} \
         num_args={num_args} delimiter={delimiter:?} values={values} \
         required={required} hidden={hidden} global={global} conflicts={conflicts} requires={requires}",
        long = arg.get_long().unwrap_or("(positional)"),
        id = arg.get_id(),
        short = arg.get_short(),
        env = arg
            .get_env()
            .map(|e| e.to_string_lossy().into_owned())
            .unwrap_or_else(|| "-".to_owned()),
        defaults = list(defaults),
        action = arg.get_action(),
        num_args = arg
            .get_num_args()
            .map(|r| format!("{r:?}"))
            .unwrap_or_else(|| "-".to_owned()),
        delimiter = arg.get_value_delimiter(),
        values = list(values),
        required = arg.is_required_set(),
        hidden = arg.is_hide_set(),
        global = arg.is_global_set(),
        conflicts = list(conflicts),
        requires = requires(arg),
    )
}

/// What the flag requires. clap has no getter for it; its `Debug` output names the ids.
fn requires(arg: &clap::Arg) -> String {
    let debug = format!("{arg:?}");
    let start = debug.find("requires: ").map(|i| i + "requires: ".len());
    let end = debug.find(", r_ifs:");
    match (start, end) {
        (Some(s), Some(e)) if s <= e => debug[s..e].replace(' ', ""),
        _ => panic!("clap's Arg Debug output changed; update `requires`: {debug}"),
    }
}

/// The ids of the flags `arg` requires.
pub(crate) fn required_ids(arg: &clap::Arg) -> Vec<String> {
    requires(arg)
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_command_line_surface_is_unchanged() {
    let now = render();
    if std::env::var_os(BLESS).is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/cli/surface.txt");
        std::fs::write(path, &now).unwrap();
        return;
    }
    let pinned: Vec<&str> = PINNED.lines().collect();
    let current: Vec<&str> = now.lines().collect();
    let gone: Vec<&&str> = pinned.iter().filter(|l| !current.contains(l)).collect();
    let new: Vec<&&str> = current.iter().filter(|l| !pinned.contains(l)).collect();
    assert!(
        gone.is_empty() && new.is_empty(),
        "the command line changed (flags, environment variables, defaults or arity are \
         user-visible; if this is deliberate, rerun with {BLESS}=1 and review the diff)\n\
         pinned, now missing:\n{gone:#?}\nnew:\n{new:#?}"
    );
}
