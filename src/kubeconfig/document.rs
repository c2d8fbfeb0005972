//! A kubeconfig as YAML text: a cluster, a user and a context per entry, every string written
//! as a double-quoted scalar, escaped where YAML wants it, so that no value (a URL, a server
//! name, a token) can change the document's structure.

use std::fmt::Write as _;

/// One cluster of the kubeconfig, its user and its context, all three named `name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// What kubectl sends its requests to.
    pub server: String,
}

/// How kubectl trusts the server (the same for every entry).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    /// PEM CA certificates, written base64-encoded as `certificate-authority-data`.
    pub certificate_authority: Option<Vec<u8>>,
    pub insecure_skip_tls_verify: bool,
    pub tls_server_name: Option<String>,
}

/// A kubeconfig: its entries (the first is the current context), how kubectl trusts the
/// server, and what each user and context carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Document {
    pub entries: Vec<Entry>,
    pub trust: Trust,
    /// A bearer token for every user; `None` leaves the users empty.
    pub token: Option<String>,
    /// The namespace of every context; `None`: kubectl's default.
    pub namespace: Option<String>,
}

impl Document {
    /// The YAML text.
    pub fn render(&self) -> String {
        let mut out = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
        for e in &self.entries {
            let _ = write!(out, "- name: {}\n  cluster:\n", quoted(&e.name));
            let _ = writeln!(out, "    server: {}", quoted(&e.server));
            self.write_trust(&mut out);
        }
        out.push_str("users:\n");
        for e in &self.entries {
            let _ = writeln!(out, "- name: {}", quoted(&e.name));
            match &self.token {
                Some(token) => {
                    let _ = writeln!(out, "  user:\n    token: {}", quoted(token));
                }
                None => out.push_str("  user: {}\n"),
            }
        }
        out.push_str("contexts:\n");
        for e in &self.entries {
            let name = quoted(&e.name);
            let _ = write!(
                out,
                "- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n"
            );
            if let Some(ns) = &self.namespace {
                let _ = writeln!(out, "    namespace: {}", quoted(ns));
            }
        }
        match self.entries.first() {
            Some(first) => {
                let _ = writeln!(out, "current-context: {}", quoted(&first.name));
            }
            None => out.push_str("current-context: \"\"\n"),
        }
        out
    }

    fn write_trust(&self, out: &mut String) {
        use base64::Engine as _;
        let t = &self.trust;
        if let Some(pem) = &t.certificate_authority {
            let data = base64::engine::general_purpose::STANDARD.encode(pem);
            let _ = writeln!(out, "    certificate-authority-data: {}", quoted(&data));
        }
        if t.insecure_skip_tls_verify {
            out.push_str("    insecure-skip-tls-verify: true\n");
        }
        if let Some(name) = &t.tls_server_name {
            let _ = writeln!(out, "    tls-server-name: {}", quoted(name));
        }
    }
}

/// `s` as a YAML double-quoted scalar: `"` and `\` escaped, and every character YAML does not
/// allow as it is (C0 and C1 controls, DEL, a byte-order mark, U+FFFE/U+FFFF) as `\u`.
pub fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() || matches!(c, '\u{feff}' | '\u{fffe}' | '\u{ffff}') => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn parsed(doc: &Document) -> Value {
        serde_saphyr::from_str(&doc.render()).expect("valid YAML")
    }

    #[test]
    fn every_value_reads_back_as_written() {
        let nasty = "a\"b\\c: d # e\n- f\t{g}\u{7f}\u{85}\u{feff}é'h\r";
        for s in [
            nasty, "", "null", "true", "0x10", "~", "- x", "&a *b", "'q'",
        ] {
            let doc = Document {
                entries: vec![Entry {
                    name: "old".into(),
                    server: s.into(),
                }],
                trust: Trust {
                    tls_server_name: Some(s.into()),
                    ..Trust::default()
                },
                token: Some(s.into()),
                namespace: Some(s.into()),
            };
            let v = parsed(&doc);
            assert_eq!(v["clusters"][0]["cluster"]["server"], s, "{s:?}");
            assert_eq!(v["clusters"][0]["cluster"]["tls-server-name"], s);
            assert_eq!(v["users"][0]["user"]["token"], s);
            assert_eq!(v["contexts"][0]["context"]["namespace"], s);
        }
    }

    #[test]
    fn a_cluster_user_and_context_per_entry_the_first_current() {
        let doc = Document {
            entries: ["default", "old", "ws-only"]
                .map(|n| Entry {
                    name: n.into(),
                    server: format!("https://p.example/clusters/{n}"),
                })
                .to_vec(),
            trust: Trust {
                certificate_authority: Some(b"-----BEGIN CERTIFICATE-----\n".to_vec()),
                insecure_skip_tls_verify: false,
                tls_server_name: None,
            },
            token: None,
            namespace: None,
        };
        let v = parsed(&doc);
        assert_eq!(v["current-context"], "default");
        assert_eq!(v["users"][2], json!({"name": "ws-only", "user": {}}));
        assert_eq!(
            v["contexts"][1],
            json!({"name": "old", "context": {"cluster": "old", "user": "old"}})
        );
        assert_eq!(
            v["clusters"][2],
            json!({"name": "ws-only", "cluster": {
                "server": "https://p.example/clusters/ws-only",
                "certificate-authority-data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==",
            }})
        );
    }
}
