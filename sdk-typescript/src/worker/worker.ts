// The worker: handlers registered by activity type, and the loop that keeps a
// session with the server, reconnecting with backoff and resuming the session
// whenever a stream ends, until it is told to stop. Invariants, as in the Rust
// SDK: every task received gets exactly one result, whatever its handler does;
// on shutdown it takes no new work (a task still arriving is handed back as a
// short snooze, uncounted), lets running handlers finish up to the shutdown
// timeout, then stops sending and reads until the server closes.
import { hostname } from "node:os";
import { fromJsonPayload, toJsonPayload, DecodeError, EncodeError, type ActivityDefinition } from "../activity.js";
import { WorkerError } from "../errors.js";
import type { Payload } from "../gen/spool/v1/common.js";
import type { ResultAck } from "../gen/spool/v1/worker.js";
import { quietLogger, type Logger } from "../internal/log.js";
import { doubled, jittered, sleep } from "../internal/time.js";
import { dial, InvalidEndpointError, type ConnectionOptions } from "../transport.js";
import { ActivityError } from "./activity-error.js";
import type { RawHandler } from "./attempt.js";
import { Carry } from "./carry.js";
import type { ActivityContext } from "./context.js";
import { isPermanent, runSession, SessionError, type ConnectionState, type WorkerCore } from "./session.js";

export interface WorkerOptions extends ConnectionOptions {
  /** The namespace whose activities this worker runs (default: the default one). */
  namespace?: string;
  /** A name for this worker in `spool workers` (default: host and process id). */
  identity?: string;
  /** How many activities run at once; the server never sends more (default 10). */
  maxConcurrency?: number;
  /**
   * Whether tasks, results and acks ready together travel in one message
   * (default true; a server before batches is spoken to one at a time anyway).
   */
  batches?: boolean;
  /** Bounds of the reconnect backoff (default 100 ms to 5 s). */
  reconnectBackoff?: { minMs: number; maxMs: number };
  /** How long running activities may take to finish on shutdown (default 30 s). */
  shutdownTimeoutMs?: number;
  /** HTTP/2 ping interval and timeout: how fast a dead connection is noticed
   * (default 5 s and 5 s; keep their sum under three heartbeat intervals). */
  keepAlive?: { intervalMs: number; timeoutMs: number };
  /** Where the worker logs (default: warnings and errors to stderr). */
  logger?: Logger;
}

/** A typed handler: the decoded JSON input in, the output to encode out. */
export type Handler<I, O> = (ctx: ActivityContext, input: I) => O | Promise<O>;

/** The server's answer to one result: whether it was recorded as the attempt's
 * outcome (not accepted: the attempt had already ended). */
export type Ack = ResultAck;

interface Events {
  connection: ConnectionState;
  ack: Ack;
}

export class Worker {
  readonly #options: WorkerOptions;
  readonly #handlers = new Map<string, RawHandler>();
  readonly #listeners: { [K in keyof Events]: Set<(event: Events[K]) => void> } = {
    connection: new Set(),
    ack: new Set(),
  };
  #connection: ConnectionState = { state: "connecting" };
  #running = false;

  constructor(options: WorkerOptions) {
    this.#options = options;
  }

  /** Where the connection stands now. */
  get connection(): ConnectionState {
    return this.#connection;
  }

  /** Calls `listener` on every change of the connection (`connection`), or with
   * the server's answer to every result (`ack`). Returns the unsubscribe. */
  on<K extends keyof Events>(event: K, listener: (event: Events[K]) => void): () => void {
    this.#listeners[event].add(listener);
    return () => this.#listeners[event].delete(listener);
  }

  #emit<K extends keyof Events>(event: K, value: Events[K]): void {
    for (const listener of this.#listeners[event]) listener(value);
  }

  /**
   * Runs `handler` for every task of `activity`: its input decoded from JSON
   * (and checked by the definition's `input`, if any), its output encoded to
   * JSON. Input that does not decode fails the activity for good (`BadInput`),
   * an output that cannot be encoded too (`BadOutput`).
   */
  register<I, O>(activity: ActivityDefinition<I, O> | string, handler: Handler<I, O>): this {
    const name = typeof activity === "string" ? activity : activity.name;
    const check = typeof activity === "string" ? undefined : activity.input;
    return this.registerRaw(name, async (ctx, payload) => {
      let input: I;
      try {
        const json = fromJsonPayload(payload);
        input = check ? check(json) : (json as I);
      } catch (e) {
        const what = e instanceof DecodeError ? (e as Error).message : `not a valid input: ${(e as Error).message}`;
        throw ActivityError.terminal("BadInput", `the input of ${name} is ${what.replace(/^the payload is /, "")}`);
      }
      const output = await handler(ctx, input);
      try {
        return toJsonPayload(output);
      } catch (e) {
        if (e instanceof EncodeError) throw ActivityError.terminal("BadOutput", `the output of ${name} ${e.message}`);
        throw e;
      }
    });
  }

  /** Runs `handler` for every task of `activityType` with the raw payloads (any
   * content type); `register` is the typed form. */
  registerRaw(activityType: string, handler: (ctx: ActivityContext, input: Payload) => Promise<Payload>): this {
    this.#handlers.set(activityType, handler);
    return this;
  }

  #setConnection(state: ConnectionState): void {
    this.#connection = state;
    this.#emit("connection", state);
  }

  #core(logger: Logger): WorkerCore {
    const o = this.#options;
    let connection;
    try {
      connection = dial(o);
    } catch (e) {
      if (e instanceof InvalidEndpointError) throw new WorkerError("InvalidEndpoint", e.message);
      throw e;
    }
    return {
      dial: connection,
      hello: {
        namespace: o.namespace ?? "",
        identity: o.identity ?? `${process.env.HOSTNAME || hostname() || "worker"}:${process.pid}`,
        activityTypes: [...this.#handlers.keys()].sort(),
        maxConcurrency: Math.max(1, Math.floor(o.maxConcurrency ?? 10)),
        protocolVersion: 1,
        batches: o.batches ?? true,
      },
      handlers: this.#handlers,
      shutdownTimeoutMs: o.shutdownTimeoutMs ?? 30_000,
      keepAlive: o.keepAlive ?? { intervalMs: 5_000, timeoutMs: 5_000 },
      logger,
      setConnection: (s) => this.#setConnection(s),
      acked: (ack) => this.#emit("ack", ack),
    };
  }

  /**
   * Connects and runs tasks until `signal` aborts, reconnecting with backoff
   * whenever the stream ends; then finishes what runs, reports it, and
   * resolves. Rejects with a `WorkerError` only for what retrying cannot fix: no
   * handlers, a bad address, or the server refusing the Hello (namespace,
   * protocol, token).
   */
  async run(signal: AbortSignal = new AbortController().signal): Promise<void> {
    if (this.#handlers.size === 0) throw new WorkerError("NoHandlers", "no activity handlers are registered");
    if (this.#running) throw new Error("this worker is already running");
    const logger = this.#options.logger ?? quietLogger;
    const core = this.#core(logger);
    this.#running = true;
    const { minMs, maxMs } = this.#options.reconnectBackoff ?? { minMs: 100, maxMs: 5_000 };
    const shutdownTimeout = core.shutdownTimeoutMs;
    // Survives each stream: a reconnect resumes the session, handlers running on.
    const carry = new Carry(logger);
    let delay = minMs;
    let tries = 0;
    try {
      // Until shutdown; then on while a stream lost while stopping may still be
      // resumed to finish what runs.
      while (!signal.aborted || carry.finishing()) {
        let failure: Error | undefined;
        try {
          await runSession(core, carry, signal);
        } catch (e) {
          failure = e as Error;
        }
        this.#setConnection({ state: "connecting" });
        // A stream that was welcomed worked: however it ended, the next try
        // comes soon, within the server's resume grace.
        if (carry.takeWelcomed()) {
          delay = minMs;
          tries = 0;
        }
        if (failure && isPermanent(failure)) {
          logger.error(
            "the server refused this worker; stopping: reconnecting cannot help until its configuration (namespace, token, activity types, protocol) changes",
            { error: failure.message },
          );
          const code = failure instanceof SessionError ? failure.code : undefined;
          throw failure instanceof WorkerError ? failure : new WorkerError("Rejected", failure.message, code);
        }
        if (failure) {
          tries++;
          logger.warn(`session failed; reconnecting in ~${Math.round(delay)} ms`, { error: failure.message, try: tries });
        } else if (!signal.aborted) {
          logger.info("session ended; reconnecting");
        }
        const stopping = signal.aborted;
        if (stopping) {
          carry.stopBy(shutdownTimeout);
          if (!carry.finishing()) break;
        }
        const wait = jittered(delay);
        if (stopping) {
          // Until the next try, or the shutdown's deadline.
          await sleep(Math.min(wait, (carry.stoppingBy ?? 0) - performance.now()));
          if (!carry.finishing()) break;
        } else {
          await sleep(wait, signal);
          // Shutdown while waiting: a session worth resuming is tried at once.
          if (signal.aborted) {
            carry.stopBy(shutdownTimeout);
            if (!carry.finishing()) break;
          }
        }
        delay = doubled(delay, maxMs);
      }
    } finally {
      carry.stop();
      this.#setConnection({ state: "stopped" });
      this.#running = false;
      logger.info("stopped");
    }
  }

  /**
   * `run` until the process gets SIGTERM or SIGINT (Ctrl-C): then it says
   * Goodbye, takes no new work, lets running activities finish and report (up to
   * the shutdown timeout), and resolves. A second signal ends the process at once.
   */
  async runUntilSignal(): Promise<void> {
    const stop = new AbortController();
    const onSignal = (name: NodeJS.Signals): void => {
      (this.#options.logger ?? quietLogger).info(`${name} received: finishing running activities, then stopping`);
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
      stop.abort();
    };
    process.once("SIGTERM", onSignal);
    process.once("SIGINT", onSignal);
    try {
      await this.run(stop.signal);
    } finally {
      process.off("SIGTERM", onSignal);
      process.off("SIGINT", onSignal);
    }
  }
}
