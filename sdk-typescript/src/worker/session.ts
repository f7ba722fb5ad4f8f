// One stream's life: Hello, Welcome, then tasks in and results out until the
// stream ends. The session is the only writer of its stream; handlers report
// through the carry, which outlives the stream. On shutdown it says Goodbye,
// lets what runs finish (up to the shutdown timeout, then cancels it), half-
// closes once the server's Drain says no task is on its way, and reads until
// the server closes so no ack still in flight is lost.
import { status as Status, type ServiceError, type StatusObject } from "@grpc/grpc-js";
import type { Dial } from "../transport.js";
import type { Logger } from "../internal/log.js";
import { fromDuration, toDuration } from "../internal/duration.js";
import { WorkerError } from "../errors.js";
import {
  WorkerServiceClient,
  type ActivityResult,
  type ActivityTask,
  type Hello,
  type ResultAck,
  type ServerMessage,
  type Welcome,
} from "../gen/spool/v1/worker.js";
import { runAttempt, tooLarge, type RawHandler } from "./attempt.js";
import { keyOf, type Carry, type Sink } from "./carry.js";
import { CancelledError } from "./context.js";
import { messagesOf, outboundFor, type Outbound, type SessionStream } from "./frames.js";

/** While stopping, a task that still arrives is handed back after this delay as
 * a snooze (not counted): long enough not to bounce straight back here. */
const HAND_BACK_MS = 200;
/** How long to wait for the server's answer to Goodbye (its Drain). */
const GOODBYE_WAIT_MS = 2_000;
/** After the shutdown timeout cancels handlers, how long their results may take. */
const AFTER_CANCEL_MS = 2_000;
/** The keep-alive interval when the server names none. */
const DEFAULT_HEARTBEAT_MS = 5_000;

/** Where the worker stands, as `worker.connection` reports it. */
export type ConnectionState =
  | { state: "connecting" }
  | { state: "connected"; workerId: string; resumed: boolean }
  | { state: "stopped" };

/** What a session needs of its worker. */
export interface WorkerCore {
  dial: Dial;
  hello: Omit<Hello, "resumeWorkerId" | "resumeToken" | "held">;
  handlers: ReadonlyMap<string, RawHandler>;
  shutdownTimeoutMs: number;
  keepAlive: { intervalMs: number; timeoutMs: number };
  logger: Logger;
  setConnection(state: ConnectionState): void;
  acked(ack: ResultAck): void;
}

/** A session that failed: the server refused it or broke off, or broke the protocol. */
export class SessionError extends Error {
  override readonly name = "SessionError";
  constructor(
    message: string,
    readonly code: Status | undefined,
    readonly details: string,
  ) {
    super(message);
  }
}

/** Runs one stream to its end: resolves when it ended cleanly (or the worker
 * stopped first), rejects with a `SessionError` otherwise. */
export function runSession(core: WorkerCore, carry: Carry, shutdown: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => new Session(core, carry, shutdown, resolve, reject).open());
}

class Session implements Sink {
  #client: WorkerServiceClient | undefined;
  #stream: SessionStream | undefined;
  #out: Outbound | undefined;
  #welcomed = false;
  #done = false;
  /** Taking no new work (shutdown, or the server's drain). */
  #stopping = false;
  /** The server said no task is on its way any more (or did not answer Goodbye in time). */
  #drained = false;
  /** This worker is shutting down (not a server's drain). */
  #shuttingDown = false;
  #cancelledHandlers = false;
  /** The largest payload the server takes (0: it did not say). */
  #maxPayload = 0;
  /** How the stream ended, from grpc-js's 'error' or 'status'. */
  #status: StatusObject | ServiceError | undefined;
  /** We ended the stream ourselves (a shutdown before Welcome, or giving up). */
  #abandoned = false;
  /** The server broke the protocol (no Welcome first). */
  #protocolError: string | undefined;
  #flushScheduled = false;
  readonly #timers = new Set<NodeJS.Timeout>();
  #keepAlive: NodeJS.Timeout | undefined;
  #giveUp: NodeJS.Timeout | undefined;
  readonly #onShutdown = (): void => this.#shutdown();

  constructor(
    private readonly core: WorkerCore,
    private readonly carry: Carry,
    private readonly shutdown: AbortSignal,
    private readonly resolve: () => void,
    private readonly reject: (e: Error) => void,
  ) {}

  open(): void {
    const { dial, keepAlive } = this.core;
    // A channel of its own per stream (no shared subchannel in grpc-js's own
    // backoff): the worker's reconnect loop decides when to try again. Pings
    // notice a black-holed connection before the server counts us silent.
    this.#client = new WorkerServiceClient(dial.target, dial.credentials, {
      ...dial.options,
      "grpc.use_local_subchannel_pool": 1,
      "grpc.keepalive_time_ms": keepAlive.intervalMs,
      "grpc.keepalive_timeout_ms": keepAlive.timeoutMs,
      "grpc.keepalive_permit_without_calls": 1,
    });
    const stream = this.#client.session(dial.metadata());
    this.#stream = stream;
    stream.on("data", (frame: ServerMessage) => {
      for (const m of messagesOf(frame)) this.#onMessage(m);
    });
    stream.on("error", (e: ServiceError) => {
      this.#status ??= e;
    });
    stream.on("status", (s: StatusObject) => {
      this.#status ??= s;
      // 'end' follows once buffered messages are read; this is only a backstop.
      this.#after(1_000, () => this.#finish());
    });
    stream.on("end", () => this.#finish());
    stream.write({
      message: {
        $case: "hello",
        value: {
          ...this.core.hello,
          resumeWorkerId: this.carry.resume?.workerId ?? "",
          resumeToken: this.carry.resume?.token ?? "",
          held: this.carry.held(),
        },
      },
    });
    this.shutdown.addEventListener("abort", this.#onShutdown);
    if (this.shutdown.aborted) this.#shutdown();
  }

  #after(ms: number, f: () => void): NodeJS.Timeout {
    const t = setTimeout(() => {
      this.#timers.delete(t);
      f();
    }, Math.max(0, ms));
    this.#timers.add(t);
    return t;
  }

  /** Ends the stream from this side and the session with it, cleanly. */
  #abandon(): void {
    this.#abandoned = true;
    this.#stream?.cancel();
    this.#finish();
  }

  #onMessage(m: ServerMessage): void {
    if (this.#done) return;
    const message = m.message;
    if (!this.#welcomed) {
      if (message?.$case !== "welcome") {
        this.#protocolError = "the server did not start with Welcome";
        this.#stream?.cancel();
        return this.#finish();
      }
      return this.#welcome(message.value);
    }
    switch (message?.$case) {
      case "task":
        return this.#start(message.value);
      case "cancel": {
        const c = message.value;
        this.carry.running.get(keyOf(c.workflowId, c.activityId, c.attempt))?.controller.abort(CancelledError.fromWire(c));
        return;
      }
      case "ack": {
        const ack = message.value;
        this.carry.unacked.delete(keyOf(ack.workflowId, ack.activityId, ack.attempt));
        if (!ack.accepted) this.core.logger.debug("result not accepted", { activityId: ack.activityId, attempt: ack.attempt });
        this.core.acked(ack);
        return;
      }
      case "drain":
        if (message.value.deadline) {
          this.core.logger.info("server draining: finishing running activities, then reconnecting", {
            running: this.carry.running.size,
            deadline: message.value.deadline,
          });
        }
        this.#stopping = true;
        this.#drained = true;
        return this.#check();
      default:
        return; // a second Welcome, or a message this SDK does not know
    }
  }

  #welcome(welcome: Welcome): void {
    this.#welcomed = true;
    this.carry.adopt(welcome);
    this.core.setConnection({ state: "connected", workerId: welcome.workerId, resumed: welcome.resumed });
    this.#maxPayload = Number(welcome.maxPayloadBytes);
    this.#out = outboundFor(this.#stream!, welcome);
    this.carry.sink = this;
    if (welcome.resumed) {
      for (const result of this.carry.unacked.values()) this.#out.send({ message: { $case: "result", value: result } });
    }
    this.#flushHeartbeats();
    // Keep-alives at twice the rate asked for, so one late tick is not fatal.
    const interval = fromDuration(welcome.heartbeatInterval) || DEFAULT_HEARTBEAT_MS;
    this.#keepAlive = setInterval(() => {
      this.#out?.send({ message: { $case: "heartbeat", value: { workflowId: "", activityId: "", attempt: 0, details: undefined } } });
    }, Math.max(1, interval / 2));
    if (this.shutdown.aborted) this.#shutdown();
  }

  /** Runs `task`, watched as running until its result comes; while stopping,
   * hands it back instead. */
  #start(task: ActivityTask): void {
    if (this.#stopping) return this.#handBack(task);
    const key = keyOf(task.workflowId, task.activityId, task.attempt);
    const controller = new AbortController();
    this.carry.started(key, {
      ref: { workflowId: task.workflowId, activityId: task.activityId, attempt: task.attempt },
      controller,
    });
    const beat = (details: ActivityTask["input"]): void =>
      this.carry.heartbeat(key, { workflowId: task.workflowId, activityId: task.activityId, attempt: task.attempt, details });
    void runAttempt(task, this.core.handlers.get(task.activityType), controller.signal, beat, this.#maxPayload).then((result) =>
      this.carry.finished(key, result),
    );
  }

  #handBack(task: ActivityTask): void {
    this.#out?.send({
      message: {
        $case: "result",
        value: {
          workflowId: task.workflowId,
          activityId: task.activityId,
          attempt: task.attempt,
          outcome: { $case: "snooze", value: toDuration(HAND_BACK_MS)! },
        },
      },
    });
  }

  result(result: ActivityResult): void {
    this.#flushHeartbeats();
    this.#out?.send({ message: { $case: "result", value: result } });
    this.#check();
  }

  heartbeatsPending(): void {
    if (this.#flushScheduled) return;
    this.#flushScheduled = true;
    setImmediate(() => {
      this.#flushScheduled = false;
      if (this.carry.sink === this) this.#flushHeartbeats();
    });
  }

  #flushHeartbeats(): void {
    if (!this.#out?.open) return;
    for (const beat of this.carry.heartbeats.values()) {
      if (beat.details && tooLarge(beat.details.data.length, this.#maxPayload)) {
        this.core.logger.warn("heartbeat details over the server's limit: sent without them", {
          activityId: beat.activityId,
          bytes: beat.details.data.length,
          limit: this.#maxPayload,
        });
        beat.details = undefined;
      }
      this.#out.send({ message: { $case: "heartbeat", value: beat } });
    }
    this.carry.heartbeats.clear();
  }

  /** Everything answered while stopping: stop sending, and read until the server
   * closes so acks still in flight are not lost. */
  #check(): void {
    if (this.#stopping && this.#drained && this.carry.running.size === 0 && this.#out?.open) this.#out.end();
  }

  #shutdown(): void {
    if (this.#done || this.#shuttingDown) return;
    if (!this.#welcomed) {
      // Not serving yet: give up the stream, unless it is the way to report what
      // still runs (then until the shutdown's deadline).
      if (!this.carry.finishing()) return this.#abandon();
      this.#after((this.carry.stoppingBy ?? 0) - performance.now(), () => {
        if (!this.#welcomed) this.#abandon();
      });
      return;
    }
    this.core.logger.info("shutting down: finishing running activities", { running: this.carry.running.size });
    this.#stopping = true;
    this.#shuttingDown = true;
    const stopBy = this.carry.stopBy(this.core.shutdownTimeoutMs);
    this.#giveUp = this.#after(stopBy - performance.now(), () => this.#onGiveUp());
    if (!this.#drained) {
      this.#out?.send({ message: { $case: "goodbye", value: {} } });
      this.#after(GOODBYE_WAIT_MS, () => {
        if (!this.#drained) this.core.logger.debug("no answer to Goodbye in time; taking it as given");
        this.#drained = true;
        this.#check();
      });
    }
    this.#check();
  }

  #onGiveUp(): void {
    if (this.#cancelledHandlers) {
      this.core.logger.warn("handlers did not stop; their attempts will be retried elsewhere", { running: this.carry.running.size });
      return this.#abandon();
    }
    if (this.carry.running.size > 0) {
      this.core.logger.warn("shutdown timeout: cancelling running activities", { running: this.carry.running.size });
    }
    this.carry.cancelAll(new CancelledError("worker_shutdown", "the worker's shutdown timeout passed"));
    this.#cancelledHandlers = true;
    this.#giveUp = this.#after(AFTER_CANCEL_MS, () => this.#onGiveUp());
  }

  #finish(): void {
    if (this.#done) return;
    this.#done = true;
    for (const t of this.#timers) clearTimeout(t);
    if (this.#keepAlive) clearInterval(this.#keepAlive);
    if (this.#giveUp) clearTimeout(this.#giveUp);
    this.shutdown.removeEventListener("abort", this.#onShutdown);
    if (this.carry.sink === this) this.carry.sink = undefined;
    this.#client?.close();
    // A worker stopping for good tells what still runs to stop; a dropped stream
    // leaves handlers running for the next one to resume, while shutting down
    // too, until the shutdown's deadline.
    if (this.#shuttingDown && !this.carry.finishing()) this.carry.stop();
    const status = this.#status;
    if (this.#protocolError !== undefined) return this.reject(new SessionError(this.#protocolError, undefined, this.#protocolError));
    if (this.#abandoned || (status?.code === Status.OK && this.#welcomed)) return this.resolve();
    if (status === undefined || status.code === Status.OK) {
      return this.reject(new SessionError("the server closed the stream before Welcome", undefined, ""));
    }
    const details = status.details || ("message" in status ? status.message : "");
    this.reject(new SessionError(`the session ended with ${Status[status.code]}: ${details}`, status.code, details));
  }
}

/** True when reconnecting cannot help: the configuration must change. */
export function isPermanent(e: Error): boolean {
  if (e instanceof WorkerError) return true;
  if (!(e instanceof SessionError) || e.code === undefined) return false;
  const refused = [
    Status.INVALID_ARGUMENT,
    Status.FAILED_PRECONDITION,
    Status.UNAUTHENTICATED,
    Status.PERMISSION_DENIED,
    Status.UNIMPLEMENTED,
  ].includes(e.code);
  // Servers before this version answered a stream that broke or stalled before
  // its Hello with INVALID_ARGUMENT: a fault of the connection, worth another try.
  const brokeBeforeHello =
    e.code === Status.INVALID_ARGUMENT &&
    ["no Hello within", "the stream failed before Hello", "the stream ended before Hello"].some((p) => e.details.startsWith(p));
  return refused && !brokeBeforeHello;
}
