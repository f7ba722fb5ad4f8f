//! TLS and mutual TLS: a client and a worker over `https://`, with certificates
//! made in the test; and each refusal for its own reason, as rustls names it on
//! the client (or as the alert the server sent says): a server of another CA,
//! under another name or expired; a client certificate missing, of another CA or
//! expired.

use spool_proto::{
    endpoint::{ClientTls, endpoint},
    v1::{self, ActivityStatus, activity_service_client::ActivityServiceClient},
};
use spool_server::config::Tls;
use spool_testkit::pki::Pki;

use crate::harness::*;

async fn client(
    server: &TestServer,
    tls: &ClientTls,
) -> Result<ActivityServiceClient<tonic::transport::Channel>, String> {
    let channel = endpoint(&server.endpoint, tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(ActivityServiceClient::new(channel))
}

/// A server with `pki`'s certificate, asking clients for one signed by
/// `client_ca` when set (mutual TLS).
async fn tls_server(pki: &Pki, client_ca: Option<std::path::PathBuf>) -> TestServer {
    TestServer::start_with(|c| {
        c.tls = Some(Tls {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
            client_ca,
        })
    })
    .await
}

/// A server with `pki`'s certificate that expired.
async fn expired_server(pki: &Pki) -> TestServer {
    TestServer::start_with(|c| {
        c.tls = Some(Tls {
            cert: pki.expired_server_cert.clone(),
            key: pki.expired_server_key.clone(),
            client_ca: None,
        })
    })
    .await
}

/// What refused `tls`, connecting and then calling: the error's debug form, in
/// which rustls names its reason (or the alert the server sent).
async fn refusal(server: &TestServer, tls: &ClientTls) -> String {
    match client(server, tls).await {
        Err(e) => e,
        Ok(mut c) => match c.stats(v1::StatsRequest::default()).await {
            Ok(_) => panic!("the call went through"),
            Err(status) => format!("{status:?}"),
        },
    }
}

/// A client trusting the test CA, presenting `identity` (certificate, key).
fn trusting(pki: &Pki, identity: Option<(&std::path::Path, &std::path::Path)>) -> ClientTls {
    ClientTls {
        ca_pem: Some(Pki::read(&pki.ca)),
        identity_pem: identity.map(|(cert, key)| (Pki::read(cert), Pki::read(key))),
        domain: None,
    }
}

fn assert_refused_for(refusal: &str, reason: &str, what: &str) {
    assert!(
        refusal.contains(reason),
        "{what}: refused, but not for {reason}: {refusal}"
    );
}

/// Submit over TLS, run on an SDK worker over TLS, wait for the result.
async fn round_trip(server: &TestServer, tls: ClientTls) {
    let mut client = client(server, &tls).await.expect("a TLS client connects");
    client
        .submit(request("greet", "wf", "tls"))
        .await
        .expect("submit over TLS");
    let _worker = server.worker(|w| {
        w.tls(tls.clone())
            .activity("greet", |_, _| async { spool_worker::json(&"hi") })
    });
    let done = wait(&mut client, key("wf", "tls")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
}

#[tokio::test]
async fn a_client_and_a_worker_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = tls_server(&pki, None).await;
    assert!(server.endpoint.starts_with("https://"));
    round_trip(&server, trusting(&pki, None)).await;

    // A plaintext client gets nothing from a TLS port.
    let plain = format!("http://{}", server.address());
    let mut plain_client = match tonic::transport::Channel::from_shared(plain)
        .unwrap()
        .connect()
        .await
    {
        Ok(channel) => ActivityServiceClient::new(channel),
        Err(_) => return,
    };
    assert!(
        plain_client
            .stats(v1::StatsRequest::default())
            .await
            .is_err()
    );
}

/// A client trusts a server only for a certificate of its CA, for the name it
/// asked for, within its dates.
#[tokio::test]
async fn a_server_is_trusted_only_for_its_ca_its_name_and_its_dates() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = tls_server(&pki, None).await;
    let other_ca = ClientTls {
        ca_pem: Some(Pki::read(&pki.other_ca)),
        ..Default::default()
    };
    assert_refused_for(
        &refusal(&server, &other_ca).await,
        "UnknownIssuer",
        "a server of a CA the client does not trust",
    );
    let elsewhere = ClientTls {
        domain: Some("elsewhere.example".into()),
        ..trusting(&pki, None)
    };
    assert_refused_for(
        &refusal(&server, &elsewhere).await,
        "NotValidForName",
        "a server under another name",
    );
    let expired = expired_server(&pki).await;
    assert_refused_for(
        &refusal(&expired, &trusting(&pki, None)).await,
        "Expired",
        "a server whose certificate expired",
    );
}

/// With mutual TLS, a client needs a certificate of the CA the server trusts,
/// within its dates; the server's alert says which was wrong.
#[tokio::test]
async fn mutual_tls_requires_a_valid_client_certificate_of_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = tls_server(&pki, Some(pki.ca.clone())).await;
    let foreign = (&pki.foreign_client_cert, &pki.foreign_client_key);
    let expired = (&pki.expired_client_cert, &pki.expired_client_key);
    for (certificate, alert, what) in [
        (
            None,
            "CertificateRequired",
            "a client without a certificate",
        ),
        (
            Some(foreign),
            "UnknownCA",
            "a client certificate of another CA",
        ),
        (
            Some(expired),
            "CertificateExpired",
            "an expired client certificate",
        ),
    ] {
        let certificate = certificate.map(|(c, k)| (c.as_path(), k.as_path()));
        assert_refused_for(
            &refusal(&server, &trusting(&pki, certificate)).await,
            alert,
            what,
        );
    }
    let valid = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
    round_trip(&server, trusting(&pki, valid)).await;
}

/// A connection that starts a TLS handshake and stalls in it (the first bytes of
/// a ClientHello, then nothing) is closed at the handshake timeout, freeing its
/// place, as a socket that sends nothing is.
#[tokio::test]
async fn a_stalled_tls_handshake_is_closed_after_the_handshake_timeout() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = tls_server(&pki, None).await;
    let mut stalled = tokio::net::TcpStream::connect(server.address())
        .await
        .expect("connect");
    // A TLS record header announcing a 512-byte ClientHello, and 19 bytes of it:
    // past the guard's first bytes, short of a whole handshake message.
    let mut start = vec![0x16, 0x03, 0x01, 0x02, 0x00];
    start.extend([0u8; 19]);
    stalled.write_all(&start).await.expect("write");
    closed_at_the_handshake_timeout(&mut stalled, std::time::Instant::now()).await;
}
