//! How a client (the CLI, the worker SDK, the benchmark) reaches a server: the
//! address forms it accepts and TLS.
//!
//! `host:port` means `http://host:port`. `https://` speaks TLS, trusting the
//! system's roots plus any CA given; `http://` never does, and refuses TLS settings
//! rather than ignoring them.

use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// TLS settings of a client: PEM contents, not paths.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// A CA to trust besides the system's roots (a private CA).
    pub ca_pem: Option<Vec<u8>>,
    /// A certificate chain and key to present, for servers that require mutual TLS.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name to verify the server's certificate against, when not the URL's host.
    pub domain: Option<String>,
}

impl ClientTls {
    fn is_set(&self) -> bool {
        self.ca_pem.is_some() || self.identity_pem.is_some() || self.domain.is_some()
    }
}

/// An address or TLS setting that cannot be used, said for a person.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "{url:?} is not a server address: use host:port, http://host:port or https://host:port"
    )]
    Invalid { url: String },
    #[error("{url:?} is plaintext http:// but TLS settings were given: use https:// to speak TLS")]
    TlsOverPlaintext { url: String },
    #[error("TLS settings for {url:?} cannot be used: {reason}")]
    Tls { url: String, reason: String },
}

/// The URL a client should dial for `address`: a scheme is added when missing.
pub fn normalize(address: &str) -> String {
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

/// An endpoint for `address`, with TLS when it is `https://`.
pub fn endpoint(address: &str, tls: &ClientTls) -> Result<Endpoint, EndpointError> {
    let url = normalize(address);
    let invalid = || EndpointError::Invalid {
        url: address.to_owned(),
    };
    let https = if url.starts_with("https://") {
        true
    } else if url.starts_with("http://") {
        false
    } else {
        return Err(invalid());
    };
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|_| invalid())?
        .connect_timeout(Duration::from_secs(5));
    if !https {
        if tls.is_set() {
            return Err(EndpointError::TlsOverPlaintext {
                url: address.to_owned(),
            });
        }
        return Ok(endpoint);
    }
    let mut config = ClientTlsConfig::new().with_native_roots();
    if let Some(ca) = &tls.ca_pem {
        config = config.ca_certificate(Certificate::from_pem(ca));
    }
    if let Some((cert, key)) = &tls.identity_pem {
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(domain) = &tls.domain {
        config = config.domain_name(domain.clone());
    }
    endpoint.tls_config(config).map_err(|e| EndpointError::Tls {
        url: address.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_without_a_scheme_are_plaintext() {
        assert_eq!(normalize("127.0.0.1:7070"), "http://127.0.0.1:7070");
        assert_eq!(normalize("https://h:1"), "https://h:1");
        assert!(endpoint("127.0.0.1:7070", &ClientTls::default()).is_ok());
        assert!(matches!(
            endpoint("ftp://h:1", &ClientTls::default()),
            Err(EndpointError::Invalid { .. })
        ));
    }

    #[test]
    fn tls_settings_on_plaintext_are_refused_not_ignored() {
        let tls = ClientTls {
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            ..Default::default()
        };
        assert!(matches!(
            endpoint("http://h:1", &tls),
            Err(EndpointError::TlsOverPlaintext { .. })
        ));
    }
}
