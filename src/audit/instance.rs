//! Session ids unique across replicas: the proxy is stateless and runs as many replicas behind
//! one Service, so a per-process counter alone would repeat across them and across restarts.

use std::sync::OnceLock;

/// This process's random id: 8 hex digits, chosen once.
pub fn instance_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let mut bytes = [0u8; 4];
        if getrandom::fill(&mut bytes).is_err() {
            // No entropy source: the start time still tells restarts apart.
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos() ^ std::process::id())
                .unwrap_or_else(|_| std::process::id());
            bytes = nanos.to_be_bytes();
        }
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    })
}

/// The audit id of this process's session number `n`: `<instance>-<n>`.
pub fn session_id(n: u64) -> String {
    format!("{}-{n}", instance_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_instance() {
        let id = instance_id();
        assert_eq!(id.len(), 8);
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(session_id(42), format!("{id}-42"));
        assert_eq!(instance_id(), id, "chosen once");
    }
}
