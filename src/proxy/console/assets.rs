//! The console's files, embedded in the binary: its own page, script and style
//! (`console/app/`), and the third-party terminal and player that build.rs bundled from the
//! locked npm packages, with their licenses.

/// One file the console serves.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// Its name under the console's path.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

macro_rules! app {
    ($name:literal, $type:expr) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/console/app/", $name)),
        }
    };
}

macro_rules! vendor {
    ($name:literal, $type:expr) => {
        Asset {
            name: $name,
            content_type: $type,
            body: include_bytes!(concat!(env!("OUT_DIR"), "/console-vendor/", $name)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// Every file, by name; `index.html` is what the console's own path shows.
pub const ASSETS: &[Asset] = &[
    app!("index.html", "text/html; charset=utf-8"),
    app!("console.js", JS),
    app!("console.css", CSS),
    vendor!("xterm.js", JS),
    vendor!("xterm.css", CSS),
    vendor!("xterm.LICENSE", TEXT),
    vendor!("asciinema-player.js", JS),
    vendor!("asciinema-player.css", CSS),
    vendor!("asciinema-player.LICENSE", TEXT),
];

/// The file called `name` (`""`: the page).
pub fn find(name: &str) -> Option<&'static Asset> {
    let name = if name.is_empty() { "index.html" } else { name };
    ASSETS.iter().find(|a| a.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_there_and_the_licenses_are_kept() {
        for asset in ASSETS {
            assert!(!asset.body.is_empty(), "{} is empty", asset.name);
        }
        let xterm = find("xterm.LICENSE").unwrap();
        assert!(std::str::from_utf8(xterm.body).unwrap().contains("MIT"));
        let player = find("asciinema-player.LICENSE").unwrap();
        assert!(std::str::from_utf8(player.body)
            .unwrap()
            .contains("Apache License"));
    }

    #[test]
    fn the_page_is_the_default_and_unknown_names_are_not_found() {
        assert_eq!(find("").unwrap().name, "index.html");
        assert!(find("../Cargo.toml").is_none());
        assert!(find("index.html/").is_none());
    }
}
