// What the end-to-end tests run against: the real `spool` binary as a process
// (SPOOL_BIN, default ../target/debug/spool) on a free loopback port and a
// fresh SQLite file, which a test can kill -9 and restart; a TCP proxy in front
// of it that the test cuts or refuses; and polling with a deadline instead of
// sleeps.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import { createServer, connect, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";
import { Client, silentLogger, SpoolError, status, Worker, type TlsOptions, type WorkerOptions } from "../src/index.js";

/** The package's folder (tests run from build/test/). */
export const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
export const spoolBin = process.env.SPOOL_BIN ? resolve(process.env.SPOOL_BIN) : resolve(packageRoot, "../target/debug/spool");

const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

/** One server, and a client of it, for a whole test file: started before its
 * first test (`started` is handed both), stopped after its last. */
export function sharedServer(started: (server: SpoolServer, client: Client) => void): void {
  let server: SpoolServer | undefined;
  let client: Client | undefined;
  before(async () => {
    server = await SpoolServer.start();
    client = server.client();
    started(server, client);
  });
  after(async () => {
    client?.close();
    await server?.stop();
  });
}

/** A free port on 127.0.0.1 (closed again: the caller binds it next). */
export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => ok(port));
    });
  });
}

/** Polls `check` until it returns something other than undefined. */
export async function eventually<T>(what: string, check: () => T | undefined | Promise<T | undefined>, timeoutMs = 15_000): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export interface ServerOptions {
  /** `--heartbeat-interval` (default 250ms, for prompt sweeps in tests). */
  heartbeatInterval?: string;
  /** More `spool serve` flags. */
  args?: string[];
  /** For a server started with `--tls-cert`: how the readiness probe trusts it. */
  tls?: TlsOptions;
}

/** A `spool serve` process. */
export class SpoolServer {
  proc!: ChildProcess;
  #log = "";
  #exited!: Promise<number | null>;

  private constructor(
    readonly port: number,
    readonly dir: string,
    private readonly options: ServerOptions,
  ) {}

  static async start(options: ServerOptions = {}): Promise<SpoolServer> {
    if (!existsSync(spoolBin)) {
      throw new Error(`no spool binary at ${spoolBin}: build it (cargo build -p spool) or set SPOOL_BIN`);
    }
    const server = new SpoolServer(await freePort(), mkdtempSync(join(tmpdir(), "spool-ts-")), options);
    await server.#spawn();
    return server;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** The server's output so far, for a failing test's message. */
  get log(): string {
    return this.#log;
  }

  async #spawn(): Promise<void> {
    const args = [
      "serve",
      "--listen",
      this.address,
      "--database",
      `sqlite://${join(this.dir, "spool.db")}`,
      "--heartbeat-interval",
      this.options.heartbeatInterval ?? "250ms",
      ...(this.options.args ?? []),
    ];
    const proc = spawn(spoolBin, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? "warn" } });
    this.proc = proc;
    children.add(proc);
    const keep = (chunk: Buffer): void => {
      this.#log = (this.#log + chunk.toString()).slice(-20_000);
    };
    proc.stdout!.on("data", keep);
    proc.stderr!.on("data", keep);
    this.#exited = new Promise((ok) =>
      proc.once("exit", (code) => {
        children.delete(proc);
        ok(code);
      }),
    );
    const tls = this.options.tls;
    const client = new Client({ address: tls ? `https://localhost:${this.port}` : this.address, ...(tls ? { tls } : {}), retry: { attempts: 1 } });
    try {
      await eventually(
        "the server to answer",
        async () => {
          if (proc.exitCode !== null) throw new Error(`spool serve exited ${proc.exitCode}: ${this.#log}`);
          // Any answer but UNAVAILABLE (say, UNAUTHENTICATED) is a server up.
          return client.serverInfo().then(
            () => true,
            (e: unknown) => (e instanceof SpoolError && e.code !== status.UNAVAILABLE ? true : undefined),
          );
        },
        20_000,
      );
    } finally {
      client.close();
    }
  }

  /** kill -9, and waits for the process to be gone. */
  async kill9(): Promise<void> {
    process.kill(this.proc.pid!, "SIGKILL");
    await this.#exited;
  }

  /** Starts again on the same port and database. */
  async restart(): Promise<void> {
    await this.#spawn();
  }

  /** SIGTERM (a drain, then exit), and the exit code. */
  async stop(): Promise<number | null> {
    if (this.proc.exitCode === null && this.proc.signalCode === null) this.proc.kill("SIGTERM");
    const code = await this.#exited;
    rmSync(this.dir, { recursive: true, force: true });
    return code;
  }

  client(): Client {
    return new Client({ address: this.address });
  }
}

/** A worker for tests: quiet, fast reconnects, fast pings, stopped by `stop()`. */
export class TestWorker {
  readonly worker: Worker;
  readonly #stop = new AbortController();
  #done: Promise<void> | undefined;

  constructor(options: WorkerOptions) {
    this.worker = new Worker({
      logger: silentLogger,
      reconnectBackoff: { minMs: 20, maxMs: 100 },
      keepAlive: { intervalMs: 200, timeoutMs: 300 },
      ...options,
    });
  }

  start(): this {
    this.#done = this.worker.run(this.#stop.signal);
    return this;
  }

  /** Waits for the worker's next connected state: whether it resumed. */
  connected(): Promise<boolean> {
    return new Promise((ok) => {
      const c = this.worker.connection;
      if (c.state === "connected") return ok(c.resumed);
      const off = this.worker.on("connection", (s) => {
        if (s.state === "connected") {
          off();
          ok(s.resumed);
        }
      });
    });
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#done;
  }
}

/** A TCP proxy in front of a server: the network a test cuts. */
export class Proxy {
  readonly #pairs = new Set<[Socket, Socket]>();
  #refusing = false;

  private constructor(
    private readonly server: Server,
    readonly port: number,
  ) {}

  static async start(upstreamPort: number): Promise<Proxy> {
    const port = await freePort();
    let proxy: Proxy | undefined;
    const server = createServer((downstream) => {
      if (proxy!.#refusing) return downstream.destroy();
      const upstream = connect(upstreamPort, "127.0.0.1");
      const pair: [Socket, Socket] = [downstream, upstream];
      proxy!.#pairs.add(pair);
      const close = (): void => {
        downstream.destroy();
        upstream.destroy();
        proxy!.#pairs.delete(pair);
      };
      downstream.on("error", close).on("close", close);
      upstream.on("error", close).on("close", close);
      downstream.pipe(upstream);
      upstream.pipe(downstream);
    });
    await new Promise<void>((ok) => server.listen(port, "127.0.0.1", ok));
    proxy = new Proxy(server, port);
    return proxy;
  }

  get address(): string {
    return `127.0.0.1:${this.port}`;
  }

  /** Breaks every connection through the proxy now. */
  cut(): void {
    for (const [a, b] of this.#pairs) {
      a.destroy();
      b.destroy();
    }
    this.#pairs.clear();
  }

  /** New connections are refused until `up()`. */
  down(): void {
    this.#refusing = true;
  }

  up(): void {
    this.#refusing = false;
  }

  /** A network cut: new connections refused (until `up()`), open ones broken. */
  cutOff(): void {
    this.down();
    this.cut();
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((ok) => this.server.close(() => ok()));
  }
}

/** A fast retry policy: `maxAttempts` attempts 10 ms apart. */
export const fastRetries = (maxAttempts: number) => ({ maxAttempts, initialIntervalMs: 10, backoffCoefficient: 1 });
