//! Who may call the sessions API: the caller as the main listener authenticated it, authorized
//! by the cluster's RBAC for group `kube-ws-proxy.io`, resource `sessions`.

use http::{HeaderMap, Response, StatusCode};

use crate::proxy::auth::Caller;
use crate::proxy::route::sessions_api::SessionsCall;
use crate::proxy::sessions::lifecycle::audit;
use crate::proxy::sessions::state::ProxyState;
use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;

/// The caller of an authorized call, as a terminate names them.
#[derive(Debug, Clone)]
pub struct Operator {
    /// Their user name (`system:unknown` where the cluster would not say).
    pub user: String,
}

/// Authorizes `call` for `caller` (whose request carried `headers`): the operator, or the
/// answer to a caller who may not.
pub async fn check(
    state: &ProxyState,
    caller: &Caller,
    headers: &HeaderMap,
    call: &SessionsCall,
) -> Result<Operator, Response<ProxyBody>> {
    let credentials = audit::outbound_credentials(state, caller, headers);
    let _ = (credentials, call);
    Err(failure(
        StatusCode::FORBIDDEN,
        "Forbidden",
        "the sessions API is not authorized yet",
    ))
}
