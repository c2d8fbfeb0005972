//! Bundles the web console's third-party files (a terminal, a recording player, their
//! licenses) into `OUT_DIR/console-vendor/`, from where `src/proxy/console/assets.rs` embeds
//! them in the binary: the console needs no network at run time.
//!
//! The packages come, in this order, from `KUBE_WS_PROXY_CONSOLE_MODULES` (a `node_modules`
//! folder), `console/node_modules` (`npm ci --prefix console`, as scripts/test.sh does), or an
//! `npm ci` of `console/package-lock.json` into `OUT_DIR` (a clean clone built by plain cargo).
//! The lock file pins every version and its integrity hash.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

/// Each bundled file: where it lies in `node_modules`, and its name in the bundle.
const VENDOR: &[(&str, &str)] = &[
    ("@xterm/xterm/lib/xterm.js", "xterm.js"),
    ("@xterm/xterm/css/xterm.css", "xterm.css"),
    ("@xterm/xterm/LICENSE", "xterm.LICENSE"),
    (
        "asciinema-player/dist/bundle/asciinema-player.min.js",
        "asciinema-player.js",
    ),
    (
        "asciinema-player/dist/bundle/asciinema-player.css",
        "asciinema-player.css",
    ),
    ("asciinema-player/LICENSE", "asciinema-player.LICENSE"),
];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-changed=console/package-lock.json");
    println!("cargo:rerun-if-changed=console/node_modules/.package-lock.json");
    println!("cargo:rerun-if-env-changed=KUBE_WS_PROXY_CONSOLE_MODULES");
    let modules = node_modules(&manifest, &out);
    let vendor = out.join("console-vendor");
    fs::create_dir_all(&vendor).expect("OUT_DIR is writable");
    for (from, to) in VENDOR {
        let source = modules.join(from);
        fs::copy(&source, vendor.join(to)).unwrap_or_else(|e| {
            panic!(
                "the web console needs {} ({e}); run `npm ci --prefix console`",
                source.display()
            )
        });
    }
}

/// The `node_modules` folder to take the packages from.
fn node_modules(manifest: &Path, out: &Path) -> PathBuf {
    if let Some(given) = env::var_os("KUBE_WS_PROXY_CONSOLE_MODULES") {
        return PathBuf::from(given);
    }
    let beside = manifest.join("console/node_modules");
    if beside.join(".package-lock.json").exists() {
        return beside;
    }
    let scratch = out.join("console-npm");
    if !scratch.join("node_modules/.package-lock.json").exists() {
        fs::create_dir_all(&scratch).expect("OUT_DIR is writable");
        for file in ["package.json", "package-lock.json"] {
            fs::copy(manifest.join("console").join(file), scratch.join(file))
                .expect("console/package.json and its lock file are in the source tree");
        }
        let status = Command::new("npm")
            .args([
                "ci",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(&scratch)
            .status();
        match status {
            Ok(s) if s.success() => {}
            other => panic!(
                "the web console's packages are missing and `npm ci` failed ({other:?}): \
                 run `npm ci --prefix console`, or set KUBE_WS_PROXY_CONSOLE_MODULES"
            ),
        }
    }
    scratch.join("node_modules")
}
