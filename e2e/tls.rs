//! TLS and mutual TLS: a client and a worker over `https://`, with certificates
//! made in the test; what fails without trust or without a client certificate.

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
    let trusted = ClientTls {
        ca_pem: Some(Pki::read(&pki.ca)),
        ..Default::default()
    };
    round_trip(&server, trusted).await;

    // Without trust in the server's CA the handshake fails.
    let untrusted = ClientTls {
        ca_pem: Some(Pki::read(&pki.other_ca)),
        ..Default::default()
    };
    let refused = match client(&server, &untrusted).await {
        Err(e) => e,
        Ok(mut c) => c
            .stats(v1::StatsRequest::default())
            .await
            .expect_err("an untrusted server")
            .to_string(),
    };
    assert!(!refused.is_empty());
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

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = tls_server(&pki, Some(pki.ca.clone())).await;
    let without_identity = ClientTls {
        ca_pem: Some(Pki::read(&pki.ca)),
        ..Default::default()
    };
    let refused = match client(&server, &without_identity).await {
        Err(_) => true,
        Ok(mut c) => c.stats(v1::StatsRequest::default()).await.is_err(),
    };
    assert!(refused, "a client without a certificate is refused");
    let with_identity = ClientTls {
        ca_pem: Some(Pki::read(&pki.ca)),
        identity_pem: Some((Pki::read(&pki.client_cert), Pki::read(&pki.client_key))),
        domain: None,
    };
    round_trip(&server, with_identity).await;
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
