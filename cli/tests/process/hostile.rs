//! Requests meant to exhaust the server, measured on the real process: what one
//! request may make it hold.

use spool_proto::v1;

use super::support::*;

/// A batch that names one key with a 64 KiB input and then 9,999 times more
/// (about 0.5 MB on the wire) builds one row: the server's peak memory grows by
/// a small multiple of the request, not by the input once per repeat (640 MiB).
#[tokio::test]
async fn a_batch_repeating_one_key_holds_memory_bounded_by_its_size() {
    use prost::Message;
    let env = Env::new();
    let (server, mut client) = env.serving(&[]).await;
    let first = v1::SubmitRequest {
        input: Some(v1::Payload {
            content_type: "application/octet-stream".into(),
            data: vec![b'x'; 64 * 1024],
        }),
        ..sleep_request("big", 0, None)
    };
    let repeat = v1::SubmitRequest {
        input: None,
        ..first.clone()
    };
    let batch = v1::SubmitBatchRequest {
        activities: std::iter::once(first)
            .chain(std::iter::repeat_n(repeat, 9_999))
            .collect(),
    };
    let size = batch.encoded_len() as u64;
    let before = server.peak_rss();
    let answer = client
        .submit_batch(batch)
        .await
        .expect("a batch that repeats a key is answered")
        .into_inner();
    let grown = server.peak_rss().saturating_sub(before);
    assert_eq!(answer.results.len(), 10_000);
    assert!(answer.results[0].created);
    assert!(answer.results[1..].iter().all(|r| !r.created));
    assert!(
        answer.results[1..]
            .iter()
            .all(|r| r.activity.as_ref().is_some_and(|a| a.input.is_none())),
        "a repeat is answered without the payload"
    );
    assert_eq!(
        get(&mut client, "big").await.input.map(|p| p.data.len()),
        Some(64 * 1024),
        "the first entry is the one stored"
    );
    assert!(
        grown < 64 * size,
        "a {size}-byte request grew the server's peak memory by {grown} bytes"
    );
}

/// A repeat that names another type is refused, and nothing of the batch is
/// stored.
#[tokio::test]
async fn a_batch_repeating_a_key_with_another_type_stores_nothing() {
    let env = Env::new();
    let (_server, mut client) = env.serving(&[]).await;
    let other = v1::SubmitRequest {
        activity_type: "other".into(),
        ..sleep_request("a", 0, None)
    };
    let err = client
        .submit_batch(v1::SubmitBatchRequest {
            activities: vec![
                sleep_request("first", 0, None),
                sleep_request("a", 0, None),
                other,
            ],
        })
        .await
        .expect_err("a key named with two types");
    assert_eq!(err.code(), tonic::Code::AlreadyExists, "{err:?}");
    assert!(list_all(&mut client).await.is_empty());
}
