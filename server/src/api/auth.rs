//! Authentication and authorization.
//!
//! An interceptor on every Spool service (health and reflection stay open, as probes
//! and tools expect) turns the `authorization: Bearer <token>` header into a
//! [`Principal`], stored in the request's extensions; each RPC then checks the role
//! and namespace it needs with [`authorize`]. Without any token configured, every
//! caller is an admin of every namespace.
//!
//! Tokens come from `--auth-token` (one admin token) and `--tokens-file`, a JSON file:
//!
//! ```json
//! {"tokens": [
//!   {"token": "…", "role": "admin"},
//!   {"token": "…", "role": "client", "namespaces": ["orders", "billing"]},
//!   {"token": "…", "role": "worker", "namespaces": ["orders"]}
//! ]}
//! ```
//!
//! Roles: `viewer` may read (`Get`, `Wait`, `List`, `Stats`, the dashboard's
//! pages) and change nothing; `client` may use all of `ActivityService`; `worker`
//! may open `WorkerService` sessions; `admin` may do all of that and use
//! `AdminService`. Without `namespaces` (or with `"*"` in them) a token covers
//! every namespace.

use std::{collections::HashSet, path::Path, sync::Arc};

use serde::Deserialize;
use tonic::{Request, Status, service::Interceptor};

use super::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads only.
    Viewer,
    Client,
    Worker,
    Admin,
}

impl Role {
    fn allows(self, needed: Role) -> bool {
        self == Role::Admin || self == needed || (self == Role::Client && needed == Role::Viewer)
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Client => "client",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

/// Who is calling: a role, and the namespaces it may touch (`None`: all).
#[derive(Debug, Clone)]
pub struct Principal {
    role: Role,
    namespaces: Option<Arc<HashSet<String>>>,
    /// Which token this is, for per-token limits, never the token itself:
    /// `auth-token`, `tokens[i]` of the tokens file, or `anonymous` without auth.
    caller: Arc<str>,
}

impl Principal {
    fn everything(caller: &str) -> Self {
        Self {
            role: Role::Admin,
            namespaces: None,
            caller: caller.into(),
        }
    }

    /// Names the token (not its secret) for limits and logs.
    pub fn caller(&self) -> &Arc<str> {
        &self.caller
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether this principal may act as `needed` (in some namespace).
    pub fn may(&self, needed: Role) -> bool {
        self.role.allows(needed)
    }

    /// The namespaces it covers, sorted; `None`: every one.
    pub fn namespaces(&self) -> Option<Vec<String>> {
        self.namespaces.as_ref().map(|n| {
            let mut list: Vec<String> = n.iter().cloned().collect();
            list.sort();
            list
        })
    }
}

/// Checks that the caller of `request` may act as `needed` in `namespace`.
pub fn authorize<T>(request: &Request<T>, needed: Role, namespace: &str) -> Result<(), Error> {
    authorize_principal(request.extensions().get::<Principal>(), needed, namespace)
}

/// Checks only that the caller of `request` was authenticated (any role, any
/// namespace): for what every caller may know, such as the server's limits.
pub fn authenticated<T>(request: &Request<T>) -> Result<(), Error> {
    match request.extensions().get::<Principal>() {
        Some(_) => Ok(()),
        None => Err(Error::Unauthenticated(
            "no credentials were checked for this call",
        )),
    }
}

/// Checks that the caller of `request` may act as `needed` in every namespace
/// (calls about the whole node, such as a drain).
pub fn authorize_everywhere<T>(request: &Request<T>, needed: Role) -> Result<(), Error> {
    let principal = request.extensions().get::<Principal>();
    if principal.is_some_and(|p| p.namespaces.is_some()) {
        return Err(Error::PermissionDenied(
            "this call concerns every namespace; this token covers only some".to_owned(),
        ));
    }
    authorize_principal(principal, needed, "")
}

/// [`authorize`] for a principal taken from a request earlier (a stream whose
/// namespace arrives in its first message).
pub fn authorize_principal(
    principal: Option<&Principal>,
    needed: Role,
    namespace: &str,
) -> Result<(), Error> {
    let Some(principal) = principal else {
        return Err(Error::Unauthenticated(
            "no credentials were checked for this call",
        ));
    };
    if !principal.role.allows(needed) {
        return Err(Error::PermissionDenied(format!(
            "this token's role is {}; this call needs {}",
            principal.role.name(),
            needed.name()
        )));
    }
    if let Some(allowed) = &principal.namespaces
        && !allowed.contains(namespace)
    {
        return Err(Error::PermissionDenied(format!(
            "this token does not cover namespace {namespace:?}"
        )));
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    token: String,
    role: Role,
    #[serde(default)]
    namespaces: Option<Vec<String>>,
}

/// A tokens file that cannot be used; the server does not start.
#[derive(Debug, thiserror::Error)]
#[error("tokens file {path}: {reason}")]
pub struct TokensFileError {
    path: String,
    reason: String,
}

/// The configured tokens; checks `authorization: Bearer <token>`.
#[derive(Clone)]
pub struct Auth {
    /// `None`: no token configured, everyone is an admin of everything.
    tokens: Option<Arc<Vec<(String, Principal)>>>,
}

impl Auth {
    pub fn new(
        auth_token: Option<String>,
        tokens_file: Option<&Path>,
    ) -> Result<Self, TokensFileError> {
        let mut tokens = Vec::new();
        if let Some(token) = auth_token.filter(|t| !t.is_empty()) {
            tokens.push((token, Principal::everything("auth-token")));
        }
        if let Some(path) = tokens_file {
            tokens.extend(load(path)?);
        }
        Ok(Self {
            tokens: (!tokens.is_empty()).then(|| Arc::new(tokens)),
        })
    }
}

fn load(path: &Path) -> Result<Vec<(String, Principal)>, TokensFileError> {
    let fail = |reason: String| TokensFileError {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let file: TokensFile = serde_json::from_str(&text).map_err(|e| fail(e.to_string()))?;
    let mut seen = HashSet::new();
    file.tokens
        .into_iter()
        .enumerate()
        .map(|(i, entry)| {
            if entry.token.len() < crate::config::MIN_TOKEN_LEN {
                return Err(fail(format!(
                    "tokens[{i}]: a token must be at least {} characters",
                    crate::config::MIN_TOKEN_LEN
                )));
            }
            if !seen.insert(entry.token.clone()) {
                return Err(fail(format!("tokens[{i}]: the same token appears twice")));
            }
            let namespaces = match entry.namespaces {
                Some(list) if !list.iter().any(|n| n == "*") => {
                    for n in &list {
                        super::validate::namespace(n)
                            .map_err(|e| fail(format!("tokens[{i}]: {e}")))?;
                    }
                    Some(Arc::new(list.into_iter().collect::<HashSet<_>>()))
                }
                _ => None,
            };
            Ok((
                entry.token,
                Principal {
                    role: entry.role,
                    namespaces,
                    caller: format!("tokens[{i}]").into(),
                },
            ))
        })
        .collect()
}

impl Auth {
    /// Who presents `bearer` (the token of an `authorization: Bearer` header).
    /// Whether calls must present a token (the server has tokens configured).
    pub fn required(&self) -> bool {
        self.tokens.is_some()
    }

    pub fn principal(&self, bearer: Option<&str>) -> Result<Principal, Error> {
        let Some(tokens) = &self.tokens else {
            return Ok(Principal::everything("anonymous"));
        };
        let Some(presented) = bearer else {
            return Err(Error::Unauthenticated(
                "a bearer token is required: send 'authorization: Bearer <token>' (spool --token / SPOOL_TOKEN)",
            ));
        };
        // Compare with every token, without an early exit, so timing does not tell
        // which one (or which prefix) matched.
        let mut found = None;
        for (token, principal) in tokens.iter() {
            if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
                found = Some(principal.clone());
            }
        }
        found.ok_or(Error::Unauthenticated("the bearer token is not valid"))
    }
}

impl Interceptor for Auth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let bearer = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let principal = self.principal(bearer)?;
        // The connection may stay open past --first-request-timeout now.
        if let Some(peer) = request.extensions().get::<crate::transport::Peer>() {
            peer.authenticated();
        }
        request.extensions_mut().insert(principal);
        Ok(request)
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(auth: &mut Auth, header: Option<&str>) -> Result<Request<()>, tonic::Code> {
        let mut request = Request::new(());
        if let Some(h) = header {
            request.metadata_mut().insert(
                "authorization",
                h.parse().map_err(|_| tonic::Code::Internal)?,
            );
        }
        auth.call(request).map_err(|s| s.code())
    }

    #[test]
    fn checks_the_bearer_token() {
        let mut auth = Auth::new(Some("s3cret".into()), None).unwrap();
        assert!(call(&mut auth, Some("Bearer s3cret")).is_ok());
        assert_eq!(
            call(&mut auth, Some("Bearer nope")).err(),
            Some(tonic::Code::Unauthenticated)
        );
        assert_eq!(
            call(&mut auth, None).err(),
            Some(tonic::Code::Unauthenticated)
        );
        let mut open = Auth::new(None, None).unwrap();
        let request = call(&mut open, None).unwrap();
        assert!(authorize(&request, Role::Admin, "any").is_ok());
    }

    #[test]
    fn roles_and_namespaces_from_a_tokens_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        std::fs::write(
            &path,
            r#"{"tokens": [
                {"token": "client-token-0123456789", "role": "client", "namespaces": ["orders"]},
                {"token": "worker-token-0123456789", "role": "worker"}
            ]}"#,
        )
        .unwrap();
        let mut auth = Auth::new(None, Some(&path)).unwrap();
        let client = call(&mut auth, Some("Bearer client-token-0123456789")).unwrap();
        assert!(authorize(&client, Role::Client, "orders").is_ok());
        assert!(matches!(
            authorize(&client, Role::Client, "default"),
            Err(Error::PermissionDenied(_))
        ));
        assert!(matches!(
            authorize(&client, Role::Worker, "orders"),
            Err(Error::PermissionDenied(_))
        ));
        let worker = call(&mut auth, Some("Bearer worker-token-0123456789")).unwrap();
        assert!(authorize(&worker, Role::Worker, "anything").is_ok());
        assert!(matches!(
            authorize(&worker, Role::Admin, "anything"),
            Err(Error::PermissionDenied(_))
        ));
    }

    #[test]
    fn a_bad_tokens_file_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.json");
        for (text, reason) in [
            (
                r#"{"tokens": [{"token": "short", "role": "admin"}]}"#,
                "at least 16",
            ),
            (
                r#"{"tokens": [{"token": "long-enough-token-1", "role": "boss"}]}"#,
                "unknown variant",
            ),
            (
                r#"{"tokens": [{"token": "long-enough-token-1", "role": "client", "namespaces": ["bad ns"]}]}"#,
                "namespace",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = Auth::new(None, Some(&path))
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(err.contains(reason), "{err:?} should mention {reason:?}");
        }
    }
}
