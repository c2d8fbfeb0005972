//! The dependency rules between the crate's top-level modules, between the rooms of
//! [`crate::proxy`] and between the rooms inside a room ([`INNER`]), enforced: every
//! `crate::…`, `super::…` and `self::…` path in non-test code is resolved to the module it
//! names, and an arrow the tables below do not allow fails the test with its file and line.
//! Test code (`#[cfg(test)]` items and files) may reach anywhere: a test that checks two
//! pieces fit together is not a dependency of either.
//!
//! Adding a top-level module, a room or a folder inside a room means adding a row here, with
//! the arrows it needs; the tables must stay free of cycles (checked too).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Leaves: any module may use them; they use no other module of the crate.
const LEAVES: &[&str] = &[
    "activity_clock",
    "address_budget",
    "memory_trim",
    "peer_hangup",
    "read_sizer",
    "request",
    "session_memory",
    "session_stop",
    "session_traffic",
    "timestamp",
];

/// Top-level modules and the modules (besides [`LEAVES`]) each may use.
const TOP: &[(&str, &[&str])] = &[
    ("spdy", &[]),
    ("audit", &[]),
    ("translate", &["spdy", "audit"]),
    ("sim", &["spdy"]),
    ("proxy", &["translate", "spdy", "audit"]),
    ("cli", &["proxy", "audit", "sim"]),
    ("config_file", &["cli", "proxy"]),
    (
        "app",
        &["cli", "config_file", "proxy", "translate", "audit"],
    ),
    ("kubeconfig", &["app", "cli", "proxy"]),
    ("demo", &["app", "cli", "sim", "kubeconfig"]),
];

/// The rooms of `crate::proxy` and the rooms each may use.
const ROOMS: &[(&str, &[&str])] = &[
    ("wire", &[]),
    ("observability", &["wire"]),
    ("client", &["observability", "wire"]),
    ("console", &["wire"]),
    ("upstream", &["observability", "wire"]),
    ("auth", &["upstream", "observability", "wire"]),
    ("route", &["auth", "upstream", "observability", "wire"]),
    (
        "sessions",
        &[
            "route",
            "auth",
            "upstream",
            "client",
            "observability",
            "wire",
        ],
    ),
    (
        "sessions_api",
        &[
            "sessions",
            "route",
            "auth",
            "upstream",
            "observability",
            "wire",
        ],
    ),
    (
        "listen",
        &[
            "console",
            "sessions_api",
            "sessions",
            "route",
            "auth",
            "upstream",
            "client",
            "observability",
            "wire",
        ],
    ),
];

/// Modules and the modules each may use.
type Table = &'static [(&'static str, &'static [&'static str])];

/// Rooms inside a room of `crate::proxy`: for each, the modules under it that lie below its
/// other files (its inner rooms and what they share), and which of them each may use. A
/// module under it with no row (the runners at the top of `sessions`) may use all of them.
const INNER: &[(&str, Table)] = &[(
    "sessions",
    &[
        ("registry", &[]),
        ("state", &["registry"]),
        ("lifecycle", &["state", "registry"]),
        ("relay", &["lifecycle", "state"]),
    ],
)];

/// The inner rooms of the room `room` of `crate::proxy` ([`INNER`]), if it has any.
fn inner_rooms(room: &str) -> Option<Table> {
    INNER
        .iter()
        .find(|(name, _)| *name == room)
        .map(|(_, table)| *table)
}

/// The crate's `src/` folder.
pub(crate) fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// One arrow in the code: which file and line, and the module path it names.
#[derive(Debug)]
struct Use {
    line: usize,
    path: Vec<String>,
    text: String,
}

/// The module path of a file under `src/` (`src/proxy/sessions/relay/run.rs` is
/// `proxy::sessions::relay::run`; `mod.rs` and `lib.rs` name their folder).
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src_dir()).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_owned());
    }
    parts
}

/// Every `.rs` file under `dir`, appended to `out`.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file with comments blanked and test items removed (line breaks kept, so
/// offsets still give line numbers), and the modules it declares under `#[cfg(test)]`.
fn production_code(text: &str) -> (String, Vec<String>) {
    let mut out = String::with_capacity(text.len());
    let mut test_mods = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim();
        if trimmed == "#[cfg(test)]" {
            // Skip the attributes that follow, then the item.
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            let item = lines.get(j).copied().unwrap_or("");
            let indent = &item[..item.len() - item.trim_start().len()];
            let decl = item.trim();
            let end = if decl.ends_with('{') {
                let close = format!("{indent}}}");
                (j..lines.len())
                    .find(|&k| lines[k] == close)
                    .unwrap_or(lines.len() - 1)
            } else {
                if let Some(name) = decl
                    .strip_prefix("mod ")
                    .or_else(|| decl.strip_prefix("pub mod "))
                    .and_then(|rest| rest.strip_suffix(';'))
                {
                    test_mods.push(name.trim().to_owned());
                }
                (j..lines.len())
                    .find(|&k| lines[k].trim_end().ends_with(';'))
                    .unwrap_or(j)
            };
            for _ in i..=end {
                out.push('\n');
            }
            i = end + 1;
            continue;
        }
        let code = match lines[i].find("//") {
            Some(at) => &lines[i][..at],
            None => lines[i],
        };
        out.push_str(code);
        out.push('\n');
        i += 1;
    }
    (out, test_mods)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Reads `ident(::ident)*` and any `::{…}` group at `pos`, pushing every full path.
fn parse_path(chars: &[char], mut pos: usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut path = prefix;
    loop {
        while pos < chars.len() && chars[pos].is_whitespace() {
            pos += 1;
        }
        if pos < chars.len() && chars[pos] == '{' {
            parse_group(chars, pos + 1, &path, out);
            return;
        }
        let start = pos;
        while pos < chars.len() && is_ident(chars[pos]) {
            pos += 1;
        }
        if start == pos {
            break;
        }
        path.push(chars[start..pos].iter().collect());
        if chars.get(pos) == Some(&':') && chars.get(pos + 1) == Some(&':') {
            pos += 2;
        } else {
            break;
        }
    }
    out.push(path);
}

/// Reads the comma-separated paths of a `{…}` group starting at `pos`.
fn parse_group(chars: &[char], mut pos: usize, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut depth = 0;
    let mut item_start = pos;
    while pos < chars.len() {
        match chars[pos] {
            '{' => depth += 1,
            '}' if depth == 0 => {
                parse_path(chars, item_start, prefix.to_vec(), out);
                return;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parse_path(chars, item_start, prefix.to_vec(), out);
                item_start = pos + 1;
            }
            _ => {}
        }
        pos += 1;
    }
}

/// Every `crate::`, `super::` and `self::` path in `code`, resolved against `module`.
fn uses(code: &str, module: &[String]) -> Vec<Use> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
            i += 1;
            continue;
        }
        let preceded = i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':');
        let word = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|w| chars[i..].iter().take(w.len()).copied().eq(w.chars()));
        let Some(word) = word.filter(|_| !preceded) else {
            i += 1;
            continue;
        };
        let mut paths = Vec::new();
        parse_path(&chars, i, Vec::new(), &mut paths);
        let text_end = chars[i..]
            .iter()
            .position(|&c| c == ';' || c == '\n')
            .map_or(chars.len(), |n| i + n);
        let text: String = chars[i..text_end].iter().collect();
        for raw in paths {
            if let Some(path) = resolve(&raw, module) {
                found.push(Use {
                    line,
                    path,
                    text: text.clone(),
                });
            }
        }
        i += word.len();
    }
    found
}

/// The absolute module path `raw` names from inside `module`.
fn resolve(raw: &[String], module: &[String]) -> Option<Vec<String>> {
    let mut segments = raw.iter();
    let mut base: Vec<String> = match segments.next()?.as_str() {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => {
            let mut base = module.to_vec();
            base.pop()?;
            base
        }
        _ => return None,
    };
    for segment in segments {
        if segment == "super" {
            base.pop()?;
        } else {
            base.push(segment.clone());
        }
    }
    Some(base)
}

fn allowed(table: &[(&str, &[&str])], from: &str, to: &str) -> Option<bool> {
    let (_, may) = table.iter().find(|(name, _)| *name == from)?;
    Some(may.contains(&to))
}

/// What is wrong with one arrow, if anything.
fn violation(from: &[String], to: &[String]) -> Option<String> {
    let (from_top, to_top) = (from.first()?, to.first()?);
    if from_top != to_top {
        if LEAVES.contains(&to_top.as_str()) {
            return None;
        }
        if LEAVES.contains(&from_top.as_str()) {
            return Some(format!("{from_top} is a leaf: it uses no other module"));
        }
        return match allowed(TOP, from_top, to_top) {
            Some(true) => None,
            Some(false) => Some(format!("{from_top} may not use {to_top}")),
            None => Some(format!("{from_top} has no row in layering::TOP")),
        };
    }
    if from_top != "proxy" || from.len() < 2 || to.len() < 2 {
        return None;
    }
    let (from_room, to_room) = (&from[1], &to[1]);
    if from_room == to_room {
        return inner_violation(from_room, &from[2..], &to[2..]);
    }
    match allowed(ROOMS, from_room, to_room) {
        Some(true) => None,
        Some(false) => Some(format!("proxy::{from_room} may not use proxy::{to_room}")),
        None => Some(format!("proxy::{from_room} has no row in layering::ROOMS")),
    }
}

/// What is wrong with an arrow between two modules inside the room `room` of `crate::proxy`
/// (`from` and `to` are their paths below it), if anything: only a module with a row in the
/// room's [`INNER`] table is held to it.
fn inner_violation(room: &str, from: &[String], to: &[String]) -> Option<String> {
    let (from_inner, to_inner) = (from.first()?, to.first()?);
    if from_inner == to_inner {
        return None;
    }
    match allowed(inner_rooms(room)?, from_inner, to_inner) {
        Some(false) => Some(format!(
            "proxy::{room}::{from_inner} may not use proxy::{room}::{to_inner}"
        )),
        Some(true) | None => None,
    }
}

/// Every arrow in non-test code that the tables forbid, as `file:line: why (path)`.
fn violations() -> Vec<String> {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files.sort();
    let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut found = Vec::new();
    // Parents sort before their children's files only by path, so collect test modules first.
    let mut parsed = Vec::new();
    for file in files {
        if file.ends_with("main.rs") {
            continue; // the binary crate: its `crate::` is itself
        }
        let text = std::fs::read_to_string(&file).expect("readable source");
        let module = module_path(&file);
        let (code, tests) = production_code(&text);
        for name in tests {
            let mut child = module.clone();
            child.push(name);
            test_only.insert(child);
        }
        parsed.push((file, module, code));
    }
    for (file, module, code) in parsed {
        if (1..=module.len()).any(|n| test_only.contains(&module[..n])) {
            continue;
        }
        for used in uses(&code, &module) {
            if let Some(why) = violation(&module, &used.path) {
                let rel = file.strip_prefix(src_dir().parent().unwrap()).unwrap();
                found.push(format!(
                    "{}:{}: {why} ({})",
                    rel.display(),
                    used.line,
                    used.text.trim()
                ));
            }
        }
    }
    found
}

/// Whether a table's arrows form a cycle; returns one module on it.
fn cycle(table: &[(&str, &[&str])]) -> Option<String> {
    let graph: BTreeMap<&str, &[&str]> = table.iter().copied().collect();
    fn visit<'a>(
        node: &'a str,
        graph: &BTreeMap<&'a str, &'a [&'a str]>,
        stack: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if stack.contains(&node) {
            return Some(node.to_owned());
        }
        if !done.insert(node) {
            return None;
        }
        stack.push(node);
        for next in graph.get(node).copied().unwrap_or_default() {
            if let Some(found) = visit(next, graph, stack, done) {
                return Some(found);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    table
        .iter()
        .find_map(|(name, _)| visit(name, &graph, &mut Vec::new(), &mut done))
}

/// The modules found on disk directly under `dir` (files and folders), test-only ones aside.
fn modules_in(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("an entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() || path.extension().is_some_and(|e| e == "rs") {
            names.insert(name);
        }
    }
    names
}

#[test]
fn no_arrow_runs_against_the_layering() {
    let found = violations();
    assert!(
        found.is_empty(),
        "imports against the layering (src/layering.rs):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_tables_have_no_cycles() {
    assert_eq!(cycle(TOP), None, "layering::TOP has a cycle");
    assert_eq!(cycle(ROOMS), None, "layering::ROOMS has a cycle");
    for (room, table) in INNER {
        assert_eq!(cycle(table), None, "layering::INNER's {room} has a cycle");
    }
}

#[test]
fn every_module_and_room_has_a_row() {
    let listed: BTreeSet<&str> = TOP
        .iter()
        .map(|(n, _)| *n)
        .chain(LEAVES.iter().copied())
        .collect();
    let not_layered = ["lib", "main", "layering", "function_length"];
    for name in modules_in(&src_dir()) {
        if !not_layered.contains(&name.as_str()) {
            assert!(
                listed.contains(name.as_str()),
                "src/{name}: no row in layering::TOP"
            );
        }
    }
    let rooms: BTreeSet<&str> = ROOMS.iter().map(|(n, _)| *n).collect();
    for name in modules_in(&src_dir().join("proxy")) {
        if name != "mod" {
            assert!(
                rooms.contains(name.as_str()),
                "src/proxy/{name}: no row in layering::ROOMS"
            );
        }
    }
    // Every folder inside a room with inner rooms is one of them.
    for (room, table) in INNER {
        let dir = src_dir().join("proxy").join(room);
        for entry in std::fs::read_dir(&dir).expect("readable") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                !path.is_dir() || table.iter().any(|(n, _)| *n == name),
                "src/proxy/{room}/{name}/: no row in layering::INNER"
            );
        }
    }
}

#[test]
fn the_scanner_sees_every_form_of_path() {
    let module: Vec<String> = ["proxy", "client", "websocket"].map(String::from).to_vec();
    let code = "use super::super::sessions::state::ProxyState;\n\
                use crate::{audit::X, proxy::{wire::body, listen}};\n\
                fn f() { crate::sim::run(); } // crate::demo::x\n\
                #[cfg(test)]\nmod tests {\n    use crate::proxy::listen::server;\n}\n";
    let (code, _) = production_code(code);
    let found: Vec<(usize, String)> = uses(&code, &module)
        .into_iter()
        .map(|u| (u.line, u.path.join("::")))
        .collect();
    assert_eq!(
        found,
        vec![
            (1, "proxy::sessions::state::ProxyState".to_owned()),
            (2, "audit::X".to_owned()),
            (2, "proxy::wire::body".to_owned()),
            (2, "proxy::listen".to_owned()),
            (3, "sim::run".to_owned()),
        ]
    );
    assert!(violation(&module, &found_path("proxy::sessions::state")).is_some());
    assert!(violation(&module, &found_path("proxy::wire::body")).is_none());
    assert!(violation(&module, &found_path("translate::ws")).is_none());
    assert!(violation(
        &found_path("audit::event"),
        &found_path("translate::observe")
    )
    .is_some());
    // Inside `sessions`: the relay may use a session's lifecycle, not the other way round;
    // a runner at the top may use both.
    let (relay, lifecycle) = (
        found_path("proxy::sessions::relay::run"),
        found_path("proxy::sessions::lifecycle::end::Running"),
    );
    assert!(violation(&relay, &lifecycle).is_none());
    assert!(violation(&found_path("proxy::sessions::lifecycle::audit"), &relay).is_some());
    assert!(violation(&found_path("proxy::sessions::exec_handler"), &relay).is_none());
    assert!(violation(&found_path("proxy::sessions::relay::pump"), &relay).is_none());
}

fn found_path(path: &str) -> Vec<String> {
    path.split("::").map(String::from).collect()
}
