//! The client commands' flags: how every one reaches the server (`ClientArgs`,
//! given before or after the command's name), and the flags of the commands
//! that take no more than a namespace or a timeout.

use std::{path::PathBuf, time::Duration};

use anyhow::Context;

use crate::commands::{self, Commands, Target};

pub(crate) mod activities;
pub(crate) mod limits;

/// How a client command reaches the server. Every client command takes these, after
/// its name or before it (`spool --server X stats`); after wins, then before, then
/// the environment.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct ClientArgs {
    /// The server: host:port (plaintext), http://host:port, or https://host:port
    /// (TLS) [env: SPOOL_SERVER] [default: 127.0.0.1:7070]. For `bench`: benchmark
    /// this server instead of starting one.
    #[arg(long)]
    pub(crate) server: Option<String>,
    /// Bearer token, for a server started with --auth-token or --tokens-file
    /// [env: SPOOL_TOKEN].
    #[arg(long)]
    token: Option<String>,
    /// Print JSON instead of tables: one object per activity, the same shape in
    /// every command.
    #[arg(long)]
    pub(crate) json: bool,
    /// A CA certificate (PEM) to trust for an https:// server, besides the system's
    /// roots [env: SPOOL_CA_CERT].
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// A client certificate (PEM) for a server that requires mutual TLS
    /// [env: SPOOL_CLIENT_CERT].
    #[arg(long)]
    client_cert: Option<PathBuf>,
    /// The key (PEM) of --client-cert [env: SPOOL_CLIENT_KEY].
    #[arg(long)]
    client_key: Option<PathBuf>,
}

impl ClientArgs {
    /// These flags, with what they leave unset taken from `before` (the flags given
    /// before the command's name), then from the environment.
    pub(crate) fn or(&self, before: &ClientArgs) -> ClientArgs {
        ClientArgs {
            server: first(&self.server, &before.server, "SPOOL_SERVER"),
            token: first(&self.token, &before.token, "SPOOL_TOKEN"),
            json: self.json || before.json,
            ca_cert: first(&self.ca_cert, &before.ca_cert, "SPOOL_CA_CERT"),
            client_cert: first(&self.client_cert, &before.client_cert, "SPOOL_CLIENT_CERT"),
            client_key: first(&self.client_key, &before.client_key, "SPOOL_CLIENT_KEY"),
        }
    }
}

/// `after`, else `before`, else the environment variable `name` (unless empty).
fn first<T: Clone + From<String>>(after: &Option<T>, before: &Option<T>, name: &str) -> Option<T> {
    after.clone().or_else(|| before.clone()).or_else(|| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .map(T::from)
    })
}

/// Where and how a client command reaches the server (`client` already merged).
pub(crate) fn target(client: &ClientArgs) -> anyhow::Result<Target> {
    if client.client_cert.is_some() != client.client_key.is_some() {
        anyhow::bail!("--client-cert and --client-key go together: give both or neither");
    }
    Ok(Target {
        server: client
            .server
            .clone()
            .unwrap_or_else(|| "127.0.0.1:7070".to_owned()),
        token: client.token.clone().filter(|t| !t.is_empty()),
        json: client.json,
        tls: client_tls(client)?,
    })
}

/// The client TLS files the flags name, read now so a bad path fails before any call.
fn client_tls(cli: &ClientArgs) -> anyhow::Result<spool_proto::endpoint::ClientTls> {
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))
    };
    Ok(spool_proto::endpoint::ClientTls {
        ca_pem: cli
            .ca_cert
            .as_ref()
            .map(|p| read("--ca-cert", p))
            .transpose()?,
        identity_pem: match (&cli.client_cert, &cli.client_key) {
            (Some(cert), Some(key)) => {
                Some((read("--client-cert", cert)?, read("--client-key", key)?))
            }
            _ => None,
        },
        domain: None,
    })
}

/// Connects with `client`, whatever it leaves unset taken from `before`; a flag
/// that cannot work is a usage error.
pub(crate) async fn connect(
    client: &ClientArgs,
    before: &ClientArgs,
) -> Result<Commands, commands::Error> {
    let target =
        target(&client.or(before)).map_err(|e| commands::Error::Usage(format!("{e:#}")))?;
    Commands::connect(target).await
}

/// Only the connection flags.
#[derive(clap::Args)]
pub(crate) struct ClientOnly {
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

#[derive(clap::Args)]
pub(crate) struct NamespaceArgs {
    /// The namespace (default: "default"; for `workers` and the limits' and
    /// weights' `list`, every namespace).
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    pub(crate) namespace: String,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

impl NamespaceArgs {
    pub(crate) async fn connect(&self, before: &ClientArgs) -> Result<Commands, commands::Error> {
        connect(&self.client, before).await
    }

    /// Prints the settings of kind `S` in the namespace.
    pub(crate) async fn list<S: commands::Setting>(
        self,
        before: &ClientArgs,
    ) -> Result<i32, commands::Error> {
        self.connect(before)
            .await?
            .settings::<S>(self.namespace)
            .await
    }
}

#[derive(clap::Args)]
pub(crate) struct DrainArgs {
    /// How long running activities may take to finish before they are handed back
    /// (default: the server's --drain-timeout).
    #[arg(long, value_parser = duration)]
    pub(crate) timeout: Option<Duration>,
    #[command(flatten)]
    pub(crate) client: ClientArgs,
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    spool_proto::duration::parse(s).map_err(|e| e.to_string())
}
