//! Bearer-token authentication, as a tonic interceptor on every Spool service
//! (health and reflection stay open, as probes and tools expect).

use std::sync::Arc;

use tonic::{Request, Status, service::Interceptor};

use super::Error;

/// Checks `authorization: Bearer <token>` when a token is configured.
#[derive(Clone)]
pub struct Auth {
    token: Option<Arc<str>>,
}

impl Auth {
    pub fn new(token: Option<String>) -> Self {
        Self {
            token: token.filter(|t| !t.is_empty()).map(Into::into),
        }
    }
}

impl Interceptor for Auth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(p) if constant_time_eq(p.as_bytes(), token.as_bytes()) => Ok(request),
            Some(_) => Err(Error::Unauthenticated("the bearer token is not valid").into()),
            None => Err(Error::Unauthenticated(
                "a bearer token is required: send 'authorization: Bearer <token>' (spool --token / SPOOL_TOKEN)",
            )
            .into()),
        }
    }
}

/// Compares without an early exit, so timing does not reveal a matching prefix.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(auth: &mut Auth, header: Option<&str>) -> Result<(), tonic::Code> {
        let mut request = Request::new(());
        if let Some(h) = header {
            request.metadata_mut().insert(
                "authorization",
                h.parse().map_err(|_| tonic::Code::Internal)?,
            );
        }
        auth.call(request).map(|_| ()).map_err(|s| s.code())
    }

    #[test]
    fn checks_the_bearer_token() {
        let mut auth = Auth::new(Some("s3cret".into()));
        assert_eq!(call(&mut auth, Some("Bearer s3cret")), Ok(()));
        assert_eq!(
            call(&mut auth, Some("Bearer nope")),
            Err(tonic::Code::Unauthenticated)
        );
        assert_eq!(call(&mut auth, None), Err(tonic::Code::Unauthenticated));
        let mut open = Auth::new(None);
        assert_eq!(call(&mut open, None), Ok(()));
    }
}
