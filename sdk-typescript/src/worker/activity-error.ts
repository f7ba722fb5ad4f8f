// What a handler can fail with, as in the Rust SDK: a retryable failure (the
// retry policy decides, or `nextRetryDelayMs`), a terminal one (FAILED now), or
// a snooze (run again later without using up an attempt). Any other thrown
// value is a retryable failure named after its error class.
import { ErrorKind, type ActivityError as WireError } from "../gen/spool/v1/common.js";
import type { ActivityResult } from "../gen/spool/v1/worker.js";
import { toJsonPayload } from "../activity.js";
import { toDuration } from "../internal/duration.js";

type Outcome = NonNullable<ActivityResult["outcome"]>;

export type ActivityErrorKind = "retryable" | "terminal" | "snooze";

export interface ErrorOptions {
  /** Anything worth keeping with the error (JSON); shown by `get`. */
  details?: unknown;
}

export class ActivityError extends Error {
  override readonly name = "ActivityError";
  readonly kind: ActivityErrorKind;
  /** A short name for the kind of failure; retry policies list types not to retry. */
  readonly type: string;
  readonly details: unknown;
  /** Retryable only: overrides the retry policy's backoff for the next attempt. */
  readonly nextRetryDelayMs: number | undefined;
  /** Snooze only: run again after this long. */
  readonly snoozeMs: number | undefined;

  private constructor(
    kind: ActivityErrorKind,
    type: string,
    message: string,
    extra: { details?: unknown; nextRetryDelayMs?: number | undefined; snoozeMs?: number },
  ) {
    super(message);
    this.kind = kind;
    this.type = type;
    this.details = extra.details;
    this.nextRetryDelayMs = extra.nextRetryDelayMs;
    this.snoozeMs = extra.snoozeMs;
  }

  /** A failure to retry under the activity's retry policy. */
  static retryable(
    type: string,
    message: string,
    options: ErrorOptions & { nextRetryDelayMs?: number } = {},
  ): ActivityError {
    return new ActivityError("retryable", type, message, options);
  }

  /** A failure that ends the activity: FAILED, no more attempts. */
  static terminal(type: string, message: string, options: ErrorOptions = {}): ActivityError {
    return new ActivityError("terminal", type, message, options);
  }

  /** Not a failure: run again after `delayMs`, without using up an attempt. */
  static snooze(delayMs: number): ActivityError {
    return new ActivityError("snooze", "Snooze", `snoozed for ${delayMs} ms`, { snoozeMs: delayMs });
  }

  /** Whatever a handler threw, as the outcome it reports. */
  static from(thrown: unknown): ActivityError {
    if (thrown instanceof ActivityError) return thrown;
    if (thrown instanceof Error) {
      // The error's own class name, as the Rust SDK names `?` errors by type.
      const type = thrown.name && thrown.name !== "Error" ? thrown.name : thrown.constructor?.name || "Error";
      return ActivityError.retryable(type, thrown.message);
    }
    return ActivityError.retryable("Error", `the handler threw ${describe(thrown)}`);
  }

  /** The wire outcome of this error. */
  toOutcome(): Outcome {
    if (this.kind === "snooze") {
      return { $case: "snooze", value: toDuration(Math.max(0, this.snoozeMs ?? 0))! };
    }
    const error: WireError = {
      kind: this.kind === "terminal" ? ErrorKind.ERROR_KIND_TERMINAL : ErrorKind.ERROR_KIND_RETRYABLE,
      type: this.type,
      message: this.message,
      details: undefined,
      nextRetryDelay: this.kind === "retryable" ? toDuration(this.nextRetryDelayMs) : undefined,
    };
    if (this.details !== undefined) {
      try {
        error.details = toJsonPayload(this.details);
      } catch (e) {
        error.message += ` (its details could not be encoded: ${(e as Error).message})`;
      }
    }
    return { $case: "error", value: error };
  }
}

function describe(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
