//! Certificates made inside a test: a CA, a server certificate for `localhost`
//! and `127.0.0.1`, and a client certificate, all signed by that CA, written as PEM
//! files; and the ones trust must refuse: a client certificate of another CA, and
//! a client and a server certificate of the test CA that expired. (Shared by the
//! end-to-end and the process tests, which each use part.)

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
    /// A CA that signed nothing the server or the client trusts: trusting it
    /// alone must fail.
    pub other_ca: PathBuf,
    /// A client certificate signed by `other_ca`.
    pub foreign_client_cert: PathBuf,
    pub foreign_client_key: PathBuf,
    /// A client certificate of the test CA, valid in 2020 only.
    pub expired_client_cert: PathBuf,
    pub expired_client_key: PathBuf,
    /// A server certificate of the test CA for the same names, valid in 2020 only.
    pub expired_server_cert: PathBuf,
    pub expired_server_key: PathBuf,
}

/// A CA of its own, named `name`.
fn ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("CA certificate");
    (cert.pem(), Issuer::new(params, key))
}

/// A certificate for `names` signed by `issuer` (expired if `expired`): its PEM
/// and its key's.
fn leaf(issuer: &Issuer<'_, KeyPair>, names: &[&str], expired: bool) -> (String, String) {
    let key = KeyPair::generate().expect("key");
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = CertificateParams::new(names).expect("params");
    if expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 12, 31);
    }
    let cert = params.signed_by(&key, issuer).expect("signed certificate");
    (cert.pem(), key.serialize_pem())
}

const SERVER_NAMES: [&str; 2] = ["localhost", "127.0.0.1"];
const CLIENT_NAMES: [&str; 1] = ["spool-test-client"];

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let (ca_pem, issuer) = ca("spool test CA");
        let (other_ca_pem, other) = ca("another CA");
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("write PEM");
            path
        };
        let pair = |stem: &str, (cert, key): (String, String)| {
            (
                write(&format!("{stem}.pem"), &cert),
                write(&format!("{stem}.key"), &key),
            )
        };
        let (server_cert, server_key) = pair("server", leaf(&issuer, &SERVER_NAMES, false));
        let (client_cert, client_key) = pair("client", leaf(&issuer, &CLIENT_NAMES, false));
        let (foreign_client_cert, foreign_client_key) =
            pair("foreign-client", leaf(&other, &CLIENT_NAMES, false));
        let (expired_client_cert, expired_client_key) =
            pair("expired-client", leaf(&issuer, &CLIENT_NAMES, true));
        let (expired_server_cert, expired_server_key) =
            pair("expired-server", leaf(&issuer, &SERVER_NAMES, true));
        Self {
            ca: write("ca.pem", &ca_pem),
            server_cert,
            server_key,
            client_cert,
            client_key,
            other_ca: write("other-ca.pem", &other_ca_pem),
            foreign_client_cert,
            foreign_client_key,
            expired_client_cert,
            expired_client_key,
            expired_server_cert,
            expired_server_key,
        }
    }

    pub fn read(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read PEM")
    }
}
