//! Routing by host name, from the flags: `--cluster-host-suffix` (each cluster NAME at
//! `NAME.SUFFIX`) and the clusters' own certificates for those names, `--tls-sni-cert`.

use super::StartError;
use crate::cli::ServeArgs;
use crate::proxy::listen::tls::NamedCertFiles;
use crate::proxy::route::cluster::ClusterName;
use crate::request::host::{HostName, HostSuffix};

/// The domain of `--cluster-host-suffix`, if given (checked as at the start of the proxy).
pub fn suffix(args: &ServeArgs) -> Result<Option<HostSuffix>, StartError> {
    let Some(suffix) = &args.upstream.cluster_host_suffix else {
        return Ok(None);
    };
    HostSuffix::parse(suffix).map(Some).map_err(|e| {
        StartError::HostRouting(format!(
            "--cluster-host-suffix {suffix:?} is not a host name ({e})"
        ))
    })
}

/// The certificates of `--tls-sni-cert`, each for its cluster's host name under `suffix`; a
/// name that is not a DNS label, or given twice, stops the start.
pub(super) fn named_certs(
    args: &ServeArgs,
    suffix: Option<&HostSuffix>,
) -> Result<Vec<NamedCertFiles>, StartError> {
    let flags = &args.listeners.tls_sni_certs;
    let Some(suffix) = suffix else {
        // clap requires the suffix with the flag; this is for a settings value made otherwise.
        return match flags.is_empty() {
            true => Ok(Vec::new()),
            false => Err(StartError::HostRouting(
                "--tls-sni-cert needs --cluster-host-suffix".into(),
            )),
        };
    };
    let mut certs: Vec<NamedCertFiles> = Vec::new();
    for flag in flags {
        let name = ClusterName::parse(&flag.name)
            .map_err(|e| StartError::HostRouting(format!("--tls-sni-cert: {e}")))?;
        let host = HostName::parse(suffix.host_of(name.as_str()).as_bytes()).map_err(|e| {
            StartError::HostRouting(format!("--tls-sni-cert {name}: its host name: {e}"))
        })?;
        if certs.iter().any(|c| c.host == host) {
            return Err(StartError::HostRouting(format!(
                "--tls-sni-cert {name} is given twice"
            )));
        }
        certs.push(NamedCertFiles {
            host,
            cert: flag.cert.clone(),
            key: flag.key.clone(),
        });
    }
    Ok(certs)
}
