//! The connection: [`Builder`] settings (token, TLS, timeouts, retries), the
//! [`Client`] it makes, and how each call is sent on it.

mod activities;
mod admin;

use std::time::Duration;

use spool_proto::{
    endpoint::ClientTls,
    v1::{
        activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
    },
};
use tonic::{
    Request, Response, Status,
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};

use crate::{Error, Retry};

/// Settings for a connection; [`Builder::connect`] makes it.
#[derive(Debug, Clone)]
pub struct Builder {
    server: String,
    token: Option<String>,
    tls: ClientTls,
    retry: Retry,
    timeout: Option<Duration>,
    connect_timeout: Duration,
}

impl Builder {
    /// How UNAVAILABLE is retried (default: [`Retry::default`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The longest one call may take (sent to the server as its deadline), but a
    /// `wait`, which has its own. Default: none (the server's `--request-timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The longest `connect` (and a reconnect) may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The bearer token, for a server started with tokens.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// TLS settings for an `https://` server (a private CA, a client identity).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// Connects now; fails if the server cannot be reached.
    pub async fn connect(self) -> Result<Client, Error> {
        let token = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| Error::InvalidToken)?,
            ),
            None => None,
        };
        let endpoint = spool_proto::endpoint::endpoint(&self.server, &self.tls)
            .map_err(|e| Error::InvalidEndpoint(e.to_string()))?
            .connect_timeout(self.connect_timeout);
        let channel = endpoint.connect().await.map_err(|e| {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                reason = s.to_string();
                source = s.source();
            }
            Error::Unreachable {
                server: self.server.clone(),
                reason,
            }
        })?;
        Ok(Client {
            channel,
            token,
            server: self.server,
            retry: self.retry,
            timeout: self.timeout,
        })
    }
}

/// A connection to one Spool server. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
    token: Option<MetadataValue<Ascii>>,
    /// The endpoint as given, for errors.
    server: String,
    retry: Retry,
    timeout: Option<Duration>,
}

impl Client {
    /// Settings for a connection to `server` (`host:port`, `http://host:port`, or
    /// `https://host:port` for TLS with the system's roots).
    pub fn builder(server: impl Into<String>) -> Builder {
        Builder {
            server: server.into(),
            token: None,
            tls: ClientTls::default(),
            retry: Retry::default(),
            timeout: None,
            connect_timeout: Duration::from_secs(10),
        }
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = self.untimed(message);
        if let Some(timeout) = self.timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// A request without the call timeout (a `wait` has its own).
    fn untimed<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        request
    }

    /// Runs `call` (one gRPC call, made afresh each try), retrying UNAVAILABLE as
    /// [`Retry`] says; for calls that may safely be sent again.
    async fn retrying<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.retry.run(call).await.map_err(|s| self.failed(s))
    }

    /// A call of the activity service with `request` (and the call timeout) that
    /// may safely be sent again, retried as [`Retry`] says. `call` takes the
    /// service by value so each try's future owns what it borrows.
    async fn retried<Q, T, F, Fut>(&self, request: &Q, call: F) -> Result<T, Error>
    where
        Q: Clone,
        F: Fn(ActivityServiceClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.retrying(|| call(self.activities(), self.request(request.clone())))
            .await
    }

    /// A call sent once: one that changes something, which a retry could do twice.
    async fn once<T>(
        &self,
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<T, Error> {
        call.await
            .map(Response::into_inner)
            .map_err(|s| self.failed(s))
    }

    /// A failed call as an [`Error`].
    fn failed(&self, status: Status) -> Error {
        Error::from_call(&self.server, status)
    }

    fn activities(&self) -> ActivityServiceClient<Channel> {
        // Answers are bounded by the server; an activity may carry payloads up to
        // its limit.
        ActivityServiceClient::new(self.channel.clone()).max_decoding_message_size(usize::MAX)
    }

    fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel.clone())
    }
}
