// What a handler knows about the attempt it runs (`info`) and how it talks back
// while running: `signal` aborts with a `CancelledError` saying why (a client's
// cancel, a timeout, a drain, a shutdown), `heartbeat` reports progress, and
// `lastHeartbeat` reads what an earlier attempt last reported.
import { fromJsonPayload, toJsonPayload } from "../activity.js";
import type { Payload } from "../gen/spool/v1/common.js";
import { CancelKind, type ActivityTask, type CancelActivity } from "../gen/spool/v1/worker.js";
import { fromDuration } from "../internal/duration.js";

/** The attempt being run. */
export interface ActivityInfo {
  readonly namespace: string;
  readonly workflowId: string;
  readonly activityId: string;
  readonly activityType: string;
  /** 1 for the first attempt; snoozes and hand-backs take a number too, uncounted. */
  readonly attempt: number;
  /** The attempt budget (0 from a server that does not say). */
  readonly maxAttempts: number;
  /** How many attempts before this one counted against `maxAttempts`. */
  readonly countedAttempts: number;
  /** True when, if this attempt fails, the activity is FAILED for good. */
  readonly isLastAttempt: boolean;
  /** When this attempt became due. */
  readonly scheduledAt: Date | undefined;
  /** When the server handed this attempt to the worker. */
  readonly startedAt: Date | undefined;
  /** When the server ends this attempt (start-to-close or schedule-to-close). */
  readonly deadline: Date | undefined;
  /** How long the server waits for a heartbeat before failing the attempt. */
  readonly heartbeatTimeoutMs: number | undefined;
  /** The headers the activity was submitted with (a `traceparent`, a tenant). */
  readonly headers: Readonly<Record<string, string>>;
}

export type CancelReasonKind =
  | "requested"
  | "timed_out"
  | "server_drain"
  | "ended_elsewhere"
  | "worker_shutdown"
  | "other";

/** Why an attempt was asked to stop: `ctx.signal.reason`. */
export class CancelledError extends Error {
  override readonly name = "CancelledError";
  /** For code to branch on; `message` says it for a person. */
  readonly kind: CancelReasonKind;

  constructor(kind: CancelReasonKind, message: string) {
    super(message);
    this.kind = kind;
  }

  /** The server's CancelActivity as a reason. */
  static fromWire(cancel: CancelActivity): CancelledError {
    const kinds: Partial<Record<CancelKind, CancelReasonKind>> = {
      [CancelKind.CANCEL_KIND_REQUESTED]: "requested",
      [CancelKind.CANCEL_KIND_TIMED_OUT]: "timed_out",
      [CancelKind.CANCEL_KIND_DRAIN]: "server_drain",
      [CancelKind.CANCEL_KIND_ENDED_ELSEWHERE]: "ended_elsewhere",
    };
    return new CancelledError(kinds[cancel.kind] ?? "other", cancel.reason);
  }
}

/** Where the context's heartbeats go: the worker's session, coalesced. */
export type HeartbeatSink = (details: Payload | undefined) => void;

export function infoOf(task: ActivityTask): ActivityInfo {
  const counted = task.countedAttempts;
  return Object.freeze({
    namespace: task.namespace,
    workflowId: task.workflowId,
    activityId: task.activityId,
    activityType: task.activityType,
    attempt: task.attempt,
    maxAttempts: task.maxAttempts,
    countedAttempts: counted,
    isLastAttempt: task.maxAttempts > 0 && counted + 1 >= task.maxAttempts,
    scheduledAt: task.scheduledAt,
    startedAt: task.startedAt,
    deadline: task.deadline,
    heartbeatTimeoutMs: fromDuration(task.heartbeatTimeout),
    headers: Object.freeze({ ...task.headers }),
  });
}

/** Handed to each handler invocation. */
export class ActivityContext {
  readonly info: ActivityInfo;
  /** Aborts when this attempt is asked to stop; `signal.reason` is a `CancelledError`. */
  readonly signal: AbortSignal;
  /** What an earlier attempt last reported with a heartbeat, as sent. */
  readonly lastHeartbeatDetails: Payload | undefined;
  readonly #beat: HeartbeatSink;

  constructor(info: ActivityInfo, signal: AbortSignal, lastHeartbeat: Payload | undefined, beat: HeartbeatSink) {
    this.info = info;
    this.signal = signal;
    this.lastHeartbeatDetails = lastHeartbeat && lastHeartbeat.data.length > 0 ? lastHeartbeat : undefined;
    this.#beat = beat;
  }

  /** True once this attempt was asked to stop. */
  get cancelled(): boolean {
    return this.signal.aborted;
  }

  /** Why this attempt was asked to stop; `undefined` while it was not. */
  cancelReason(): CancelledError | undefined {
    return this.signal.aborted ? (this.signal.reason as CancelledError) : undefined;
  }

  /**
   * The details an earlier attempt last reported (JSON), where to resume long
   * work; `undefined` on a first attempt or when none reported any.
   */
  lastHeartbeat<T = unknown>(): T | undefined {
    return fromJsonPayload(this.lastHeartbeatDetails) as T | undefined;
  }

  /**
   * Reports progress (`details` as JSON, optional) and keeps the attempt alive.
   * Cheap to call often: the latest details of each attempt are sent, coalesced.
   * They are readable through `get` while it runs, and reach the next attempt
   * if this one ends unfinished. Details JSON cannot hold throw `EncodeError`.
   */
  heartbeat(details?: unknown): void {
    this.#beat(details === undefined ? undefined : toJsonPayload(details));
  }
}
