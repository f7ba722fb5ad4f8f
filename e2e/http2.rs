//! The transport as a raw HTTP/2 peer meets it: the SETTINGS the server
//! advertises, a rapid-reset flood, the connection cap, and idle sockets.

use std::time::{Duration, Instant};

use spool_proto::v1;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::harness::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;
const MAX_CONCURRENT_STREAMS: u16 = 0x3;
const MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The server's first SETTINGS frame, as `(identifier, value)` pairs.
async fn server_settings(address: &str) -> Vec<(u16, u32)> {
    let mut tcp = TcpStream::connect(address).await.expect("connect");
    tcp.write_all(PREFACE).await.expect("preface");
    // Our own (empty) SETTINGS frame: length 0, type 4, no flags, stream 0.
    tcp.write_all(&[0, 0, 0, SETTINGS, 0, 0, 0, 0, 0])
        .await
        .expect("settings");
    loop {
        let mut header = [0u8; 9];
        tokio::time::timeout(WAIT, tcp.read_exact(&mut header))
            .await
            .expect("a frame in time")
            .expect("read a frame header");
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        tcp.read_exact(&mut payload).await.expect("read a frame");
        let ack = header[4] & 0x1 != 0;
        if header[3] == SETTINGS && !ack {
            return payload
                .chunks_exact(6)
                .map(|c| {
                    (
                        u16::from_be_bytes([c[0], c[1]]),
                        u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
                    )
                })
                .collect();
        }
    }
}

#[tokio::test]
async fn the_server_advertises_its_stream_and_header_limits() {
    let server = TestServer::start_with(|c| {
        c.limits.max_concurrent_streams = 77;
        c.limits.max_header_list_bytes = 9_000;
    })
    .await;
    let settings = server_settings(server.address()).await;
    let value = |id| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
    assert_eq!(value(MAX_CONCURRENT_STREAMS), Some(77), "{settings:?}");
    assert_eq!(value(MAX_HEADER_LIST_SIZE), Some(9_000), "{settings:?}");
}

fn health_check(address: &str) -> http::Request<()> {
    http::Request::post(format!("http://{address}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// One frame: the 9-byte header, then `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a short frame");
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([kind, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// A health check's header block, in HPACK written by hand: indexed `:method
/// POST` and `:scheme http`, the rest literal and never added to the table.
fn health_check_headers(address: &str) -> Vec<u8> {
    let mut block = vec![0x83, 0x86];
    let mut literal = |name: &[u8], value: &str| {
        block.extend(name);
        block.push(u8::try_from(value.len()).expect("a short value"));
        block.extend(value.as_bytes());
    };
    literal(&[0x04], "/grpc.health.v1.Health/Check"); // :path
    literal(&[0x01], address); // :authority
    literal(&[0x0f, 0x10], "application/grpc"); // content-type (static 31)
    literal(&[0x00, 0x02, b't', b'e'], "trailers");
    block
}

/// HEADERS then RST_STREAM, a thousand times in one write: the server's limit on
/// streams reset before it accepted them (CVE-2023-44487) ends the connection
/// with GOAWAY ENHANCE_YOUR_CALM, and other clients are served all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rapid_reset_flood_is_cut_short() {
    const HEADERS: u8 = 0x1;
    const RST_STREAM: u8 = 0x3;
    const GOAWAY: u8 = 0x7;
    const END_HEADERS: u8 = 0x4;
    const CANCEL: u32 = 0x8;
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let server = TestServer::start().await;
    let address = server.address().to_owned();
    let mut client = server.client().await;
    let honest = tokio::spawn(async move {
        let mut slowest = Duration::ZERO;
        for _ in 0..40 {
            let started = Instant::now();
            client
                .stats(v1::StatsRequest::default())
                .await
                .expect("other clients are served during the flood");
            slowest = slowest.max(started.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        slowest
    });

    let mut flood = PREFACE.to_vec();
    flood.extend(frame(SETTINGS, 0, 0, &[]));
    let headers = health_check_headers(&address);
    for n in 0..1_000u32 {
        let stream = 2 * n + 1;
        flood.extend(frame(HEADERS, END_HEADERS, stream, &headers));
        flood.extend(frame(RST_STREAM, 0, stream, &CANCEL.to_be_bytes()));
    }
    let mut tcp = TcpStream::connect(&address).await.expect("connect");
    // The server may close while the flood is still being written.
    let _ = tcp.write_all(&flood).await;
    let mut went_away = None;
    loop {
        let mut header = [0u8; 9];
        match tokio::time::timeout(WAIT, tcp.read_exact(&mut header)).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => break,
            Err(_) => panic!("the connection neither went away nor closed"),
        }
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        if tcp.read_exact(&mut payload).await.is_err() {
            break;
        }
        if header[3] == GOAWAY && payload.len() >= 8 {
            went_away = Some(u32::from_be_bytes([
                payload[4], payload[5], payload[6], payload[7],
            ]));
            break;
        }
    }
    assert_eq!(
        went_away,
        Some(ENHANCE_YOUR_CALM),
        "the flooding connection was not told to calm down"
    );
    let slowest = honest.await.expect("the honest client");
    assert!(
        slowest < Duration::from_secs(5),
        "an honest call took {slowest:?} during the flood"
    );
    server
        .client()
        .await
        .stats(v1::StatsRequest::default())
        .await
        .expect("served after the flood");
}

/// At `--max-connections`, a new connection waits until one closes.
#[tokio::test]
async fn connections_beyond_the_cap_wait_for_one_to_close() {
    // The cap is each node's.
    let server = TestServer::one_node_with(|c| c.limits.max_connections = 2).await;
    let mut first = server.client().await;
    first.stats(v1::StatsRequest::default()).await.unwrap();
    let idle = TcpStream::connect(server.address()).await.expect("connect");
    // The third connection is not served while two are open.
    let third = tokio::spawn({
        let endpoint = server.endpoint.clone();
        async move {
            let channel = tonic::transport::Channel::from_shared(endpoint)
                .unwrap()
                .connect_lazy();
            let mut client = v1::activity_service_client::ActivityServiceClient::new(channel);
            client.stats(v1::StatsRequest::default()).await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!third.is_finished(), "served beyond the cap");
    drop(idle);
    let served = tokio::time::timeout(WAIT, third)
        .await
        .expect("served once a connection closed")
        .expect("task");
    assert!(served.is_ok(), "{served:?}");
}

/// A socket that never starts a handshake is closed, freeing its place.
#[tokio::test]
async fn an_idle_socket_is_closed_after_the_handshake_timeout() {
    let server = TestServer::start().await;
    let mut idle = TcpStream::connect(server.address()).await.expect("connect");
    // The server speaks first (its SETTINGS); then, hearing nothing, it closes.
    closed_at_the_handshake_timeout(&mut idle, Instant::now()).await;
}

const TOKEN: &str = "s3cret-token-0123456789";

/// A `Stats` call over raw HTTP/2 with `token` as its bearer token.
fn stats_call(address: &str, token: &str) -> http::Request<()> {
    http::Request::post(format!("http://{address}/spool.v1.ActivityService/Stats"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("request")
}

/// Sends `request` with an empty gRPC message and waits for its answer's head.
async fn call(send: &mut h2::client::SendRequest<bytes::Bytes>, request: http::Request<()>) {
    let mut ready = send.clone().ready().await.expect("ready");
    let (response, mut body) = ready.send_request(request, false).expect("send");
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
        .expect("data");
    tokio::time::timeout(WAIT, response)
        .await
        .expect("answered")
        .expect("a response");
}

/// A connection that completes the HTTP/2 handshake and answers pings, but makes
/// no authenticated request (a health check and a call with a wrong token do not
/// count), is closed at `--first-request-timeout`; one that made an authenticated
/// call stays open.
#[tokio::test]
async fn a_connection_that_never_authenticates_is_closed_at_the_first_request_timeout() {
    let server = TestServer::one_node_with(|c| {
        c.auth_token = Some(TOKEN.into());
        c.limits.first_request_timeout = Duration::from_secs(2);
    })
    .await;
    let address = server.address().to_owned();
    let open = |address: String| async move {
        let tcp = TcpStream::connect(&address).await.expect("connect");
        let (send, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
        (send, tokio::spawn(connection))
    };
    let started = Instant::now();
    let (mut stranger, stranger_connection) = open(address.clone()).await;
    let (mut known, known_connection) = open(address.clone()).await;
    call(&mut stranger, health_check(&address)).await;
    call(
        &mut stranger,
        stats_call(&address, "not-the-token-0123456789"),
    )
    .await;
    call(&mut known, stats_call(&address, TOKEN)).await;
    tokio::time::timeout(Duration::from_secs(8), stranger_connection)
        .await
        .expect("the server closes the connection")
        .expect("connection task")
        .ok();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1_800),
        "closed after {took:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !known_connection.is_finished(),
        "an authenticated connection stays open"
    );
    call(&mut known, stats_call(&address, TOKEN)).await;
}

/// Past `--max-connections-per-peer`, a new connection from the same address is
/// closed at once (the server sends nothing on it); others are served, and a
/// place freed is taken again.
#[tokio::test]
async fn connections_from_one_peer_are_capped() {
    let server = TestServer::one_node_with(|c| c.limits.max_connections_per_peer = 2).await;
    let first = TcpStream::connect(server.address()).await.expect("connect");
    let _second = TcpStream::connect(server.address()).await.expect("connect");
    let mut third = TcpStream::connect(server.address()).await.expect("connect");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
        .await
        .expect("closed at once, not left waiting");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "the server spoke on a connection over the cap: {read:?}"
    );
    drop(first);
    eventually("a freed place to be taken", || {
        let endpoint = server.endpoint.clone();
        async move {
            let channel = tonic::transport::Channel::from_shared(endpoint)
                .ok()?
                .connect()
                .await
                .ok()?;
            v1::activity_service_client::ActivityServiceClient::new(channel)
                .stats(v1::StatsRequest::default())
                .await
                .ok()
        }
    })
    .await;
}
