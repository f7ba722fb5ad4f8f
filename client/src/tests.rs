//! Tests of the client's retries and endpoints.

use super::*;

#[tokio::test]
async fn a_bad_token_or_endpoint_is_refused_before_anything_is_sent() {
    let token = Client::builder("http://127.0.0.1:1")
        .token("line\nbreak")
        .connect()
        .await;
    assert!(matches!(token, Err(Error::InvalidToken)), "{token:?}");
    let tls = ClientTls {
        ca_pem: Some(b"not used".to_vec()),
        ..Default::default()
    };
    let endpoint = Client::builder("http://127.0.0.1:1")
        .tls(tls)
        .connect()
        .await;
    assert!(
        matches!(endpoint, Err(Error::InvalidEndpoint(_))),
        "{endpoint:?}"
    );
}

#[tokio::test]
async fn nothing_listening_is_unreachable_with_the_address() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
    drop(listener);
    match Client::builder(format!("http://{addr}")).connect().await {
        Err(Error::Unreachable { server, .. }) => assert_eq!(server, format!("http://{addr}")),
        other => panic!("expected Unreachable, got {other:?}"),
    }
}
