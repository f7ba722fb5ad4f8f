// What outlives one stream of a worker: its running handlers, results not yet
// acknowledged, heartbeats not yet sent, and the ticket that resumes its
// session. A dropped stream costs nothing: the next Hello resumes the session
// with the ticket and lists what is held, handlers keep running through the
// reconnect, and every result the server did not acknowledge is sent again
// (results are fenced by attempt, so a copy is never recorded twice).
import type { Logger } from "../internal/log.js";
import type { ActivityResult, AttemptRef, Heartbeat, Welcome } from "../gen/spool/v1/worker.js";
import { CancelledError } from "./context.js";

/** An attempt's identity as a map key. */
export type AttemptKey = string;

export function keyOf(workflowId: string, activityId: string, attempt: number): AttemptKey {
  // Ids never hold control characters (the server refuses them), so NUL
  // separates them unambiguously.
  return `${workflowId}\u0000${activityId}\u0000${attempt}`;
}

/** A handler running now: its attempt, and the controller its signal watches. */
export interface RunningAttempt {
  ref: AttemptRef;
  controller: AbortController;
}

/** The live stream, which the carry hands results and heartbeats to. */
export interface Sink {
  /** Sends `result`, after the heartbeats still pending (a heartbeat made just
   * before returning is stored before the result ends its attempt). */
  result(result: ActivityResult): void;
  heartbeatsPending(): void;
}

export class Carry {
  /** Attempts running now; removed when their result comes, or when forgotten. */
  readonly running = new Map<AttemptKey, RunningAttempt>();
  /** Results produced and not yet acknowledged: sent again after a resume. */
  readonly unacked = new Map<AttemptKey, ActivityResult>();
  /** Each running attempt's latest heartbeat not yet sent (coalesced). */
  readonly heartbeats = new Map<AttemptKey, Heartbeat>();
  /** The session to resume, and its single-use ticket. */
  resume: { workerId: string; token: string } | undefined;
  /** The stream now serving, if one was welcomed; none between streams. */
  sink: Sink | undefined;
  /** Once shutting down: when running handlers are told to stop (performance.now()
   * ms), one deadline across streams so a cut while stopping does not restart it. */
  #stopBy: number | undefined;
  /** A stream was welcomed since the caller last asked. */
  #welcomed = false;

  constructor(private readonly logger: Logger) {}

  /** The worker is shutting down: the deadline for what still runs, set once. */
  stopBy(timeoutMs: number): number {
    this.#stopBy ??= performance.now() + timeoutMs;
    return this.#stopBy;
  }

  get stoppingBy(): number | undefined {
    return this.#stopBy;
  }

  /** Shutting down with a stream lost: whether a new stream should still be
   * tried (a session to resume holds attempts running or results unacknowledged,
   * and the shutdown timeout has not passed). */
  finishing(): boolean {
    return (
      this.resume !== undefined &&
      (this.running.size > 0 || this.unacked.size > 0) &&
      this.#stopBy !== undefined &&
      performance.now() < this.#stopBy
    );
  }

  takeWelcomed(): boolean {
    const welcomed = this.#welcomed;
    this.#welcomed = false;
    return welcomed;
  }

  /** The attempts this worker still has, for a resuming Hello. */
  held(): AttemptRef[] {
    const refs: AttemptRef[] = [...this.running.values()].map((r) => r.ref);
    for (const r of this.unacked.values()) {
      refs.push({ workflowId: r.workflowId, activityId: r.activityId, attempt: r.attempt });
    }
    return refs;
  }

  /** The session `welcome` started or resumed is the one a next stream resumes. */
  adopt(welcome: Welcome): void {
    if (welcome.resumed) {
      this.logger.info("reconnected: session resumed", {
        workerId: welcome.workerId,
        running: this.running.size,
        unacknowledged: this.unacked.size,
      });
    } else {
      // With or without a session to resume, a new one means the old one's
      // attempts are not this worker's any more: the server ended them.
      if (this.running.size > 0 || this.unacked.size > 0) {
        const why = welcome.resumeRefused || "the server cannot resume sessions";
        this.logger.warn(`connected with a new session (${why}): the attempts of the old one are lost to this worker`, {
          workerId: welcome.workerId,
          running: this.running.size,
        });
        this.#forget(why);
      }
      this.logger.info("connected", { workerId: welcome.workerId });
    }
    this.resume = welcome.resumeToken ? { workerId: welcome.workerId, token: welcome.resumeToken } : undefined;
    this.#welcomed = true;
  }

  /** The old session's handlers are told to stop, and what they would report
   * is not sent: the server refuses it. */
  #forget(why: string): void {
    const reason = new CancelledError("ended_elsewhere", `the server did not resume this worker's session: ${why}`);
    for (const r of this.running.values()) r.controller.abort(reason);
    this.running.clear();
    this.unacked.clear();
    this.heartbeats.clear();
  }

  started(key: AttemptKey, attempt: RunningAttempt): void {
    this.running.set(key, attempt);
  }

  /** A handler's one result: kept until acknowledged, sent if a stream serves. */
  finished(key: AttemptKey, result: ActivityResult): void {
    if (!this.running.delete(key)) {
      this.logger.debug("result of a forgotten attempt dropped", { activityId: result.activityId });
      return;
    }
    this.unacked.set(key, result);
    this.sink?.result(result);
  }

  heartbeat(key: AttemptKey, beat: Heartbeat): void {
    if (!this.running.has(key)) return;
    this.heartbeats.set(key, beat);
    this.sink?.heartbeatsPending();
  }

  /** Every running handler is told to stop, for `reason`. */
  cancelAll(reason: CancelledError): void {
    for (const r of this.running.values()) r.controller.abort(reason);
  }

  /** The worker stops for good. */
  stop(): void {
    this.cancelAll(new CancelledError("worker_shutdown", "the worker is shutting down"));
  }
}
