//! Certificates made inside a test: a CA, a server certificate for `localhost`
//! and `127.0.0.1`, and a client certificate, all signed by that CA, written as PEM
//! files. (Shared by the end-to-end and the process tests, which each use part.)

// A test helper: what it cannot do fails the test.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed nothing here: trusting it alone must fail.
    pub other_ca: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "spool test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf = |names: Vec<String>| {
            let key = KeyPair::generate().expect("key");
            let params = CertificateParams::new(names).expect("params");
            let cert = params.signed_by(&key, &issuer).expect("signed certificate");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(vec!["localhost".into(), "127.0.0.1".into()]);
        let (client_cert, client_key) = leaf(vec!["spool-test-client".into()]);
        let other_key = KeyPair::generate().expect("key");
        let mut other_params = CertificateParams::new(Vec::<String>::new()).expect("params");
        other_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let other_ca = other_params.self_signed(&other_key).expect("other CA");
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write PEM");
            path
        };
        Self {
            ca: write("ca.pem", &ca_cert.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            other_ca: write("other-ca.pem", &other_ca.pem()),
        }
    }

    pub fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read PEM")
    }
}
