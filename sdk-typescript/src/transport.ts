// How the client and the worker reach a server: the address forms they take
// (`host:port` and `http://` plaintext, `https://` TLS), the TLS settings, the
// bearer token sent as metadata on every call, and the channel options both
// need (no receive limit: an activity may carry payloads up to the server's).
import { ChannelCredentials, Metadata, type ChannelOptions } from "@grpc/grpc-js";

/** TLS for an `https://` address; without it the system's roots are trusted. */
export interface TlsOptions {
  /** A CA certificate (PEM) to trust instead of the system's roots. */
  ca?: string | Buffer;
  /** A certificate chain (PEM) to present, for a server that requires mTLS. */
  cert?: string | Buffer;
  /** The key (PEM) of `cert`. */
  key?: string | Buffer;
  /** The name the server's certificate must carry, if not the address's host. */
  serverName?: string;
}

/** What a connection needs, common to `Client` and `Worker`. */
export interface ConnectionOptions {
  /** `host:port` or `http://host:port` (plaintext), or `https://host:port` (TLS). */
  address: string;
  /** The bearer token, when the server was started with tokens. */
  token?: string;
  /** TLS settings; `https://` only. */
  tls?: TlsOptions;
}

/** An address, credentials and options grpc-js dials with. */
export interface Dial {
  target: string;
  credentials: ChannelCredentials;
  options: ChannelOptions;
  metadata: () => Metadata;
}

const asBuffer = (v: string | Buffer | undefined): Buffer | null =>
  v === undefined ? null : Buffer.isBuffer(v) ? v : Buffer.from(v);

/** Thrown for an address or TLS setting that cannot be dialled as given. */
export class InvalidEndpointError extends Error {
  override readonly name = "InvalidEndpointError";
}

export function dial(connection: ConnectionOptions, extra: ChannelOptions = {}): Dial {
  const { address, token, tls } = connection;
  const match = /^(?:(https?):\/\/)?([^/]+?)\/?$/.exec(address.trim());
  if (!match) throw new InvalidEndpointError(`${JSON.stringify(address)} is not host:port, http://host:port or https://host:port`);
  const secure = match[1] === "https";
  const target = match[2]!;
  if (!secure && tls !== undefined) {
    throw new InvalidEndpointError(`TLS settings were given for ${address}, which is not https://`);
  }
  if (tls && (tls.cert === undefined) !== (tls.key === undefined)) {
    throw new InvalidEndpointError("tls.cert and tls.key go together");
  }
  const credentials = secure
    ? ChannelCredentials.createSsl(asBuffer(tls?.ca), asBuffer(tls?.key), asBuffer(tls?.cert))
    : ChannelCredentials.createInsecure();
  const options: ChannelOptions = {
    "grpc.max_receive_message_length": -1,
    "grpc.max_send_message_length": -1,
    ...(tls?.serverName ? { "grpc.ssl_target_name_override": tls.serverName } : {}),
    ...extra,
  };
  if (token !== undefined && !/^[\x21-\x7e]+$/.test(token)) {
    throw new InvalidEndpointError("the token is not a valid header value (printable ASCII, no spaces)");
  }
  // Metadata rather than call credentials: grpc-js refuses call credentials on a
  // plaintext channel, and a server on loopback may use tokens without TLS.
  const metadata = (): Metadata => {
    const m = new Metadata();
    if (token !== undefined) m.set("authorization", `Bearer ${token}`);
    return m;
  };
  return { target, credentials, options, metadata };
}
