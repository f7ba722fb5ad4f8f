// What a submit can say, in the SDK's terms (milliseconds, JSON input, plain
// objects), and its conversion to the wire's SubmitRequest: every field of it.
import { toJsonPayload } from "../activity.js";
import type { SubmitRequest } from "../gen/spool/v1/activity.js";
import type { Payload } from "../gen/spool/v1/common.js";
import { toDuration } from "../internal/duration.js";
import { uuidv7 } from "../internal/uuid.js";

/** How failed attempts are retried; unset fields are the server's defaults. */
export interface RetryPolicy {
  maxAttempts?: number;
  initialIntervalMs?: number;
  backoffCoefficient?: number;
  maxIntervalMs?: number;
  /** Error types that fail the activity at once. */
  nonRetryableErrorTypes?: string[];
}

/** Everything but the type and input of a submit. Empty ids are generated
 * (UUIDv7) before the first try, so a retried submit names the same key. */
export interface SubmitOptions {
  namespace?: string;
  workflowId?: string;
  activityId?: string;
  /** Run no earlier than this long from now. */
  delayMs?: number;
  retryPolicy?: RetryPolicy;
  /** Fail the attempt if it reports no heartbeat for this long. */
  heartbeatTimeoutMs?: number;
  /** Fail an attempt running longer than this. */
  startToCloseTimeoutMs?: number;
  /** Fail the activity for good if not finished this long after its submit. */
  scheduleToCloseTimeoutMs?: number;
  /** Higher is claimed first. */
  priority?: number;
  /** Small string metadata delivered to every attempt (a traceparent, a tenant). */
  headers?: Record<string, string>;
  /** At most the type's concurrency limit of activities sharing it run at once. */
  concurrencyKey?: string;
  /** Served fairly over these keys (a tenant, say). */
  fairnessKey?: string;
  /** Weight within the fairness key, 1 to 1,000. */
  fairnessWeight?: number;
}

/** One activity to submit: its type, its input (JSON, or a raw `Payload` as
 * `payload`), and its options. */
export interface SubmitSpec extends SubmitOptions {
  type: string;
  input?: unknown;
  /** A raw payload of any content type, instead of `input`. */
  payload?: Payload;
}

export function toSubmitRequest(spec: SubmitSpec): SubmitRequest {
  const policy = spec.retryPolicy;
  return {
    namespace: spec.namespace ?? "",
    workflowId: spec.workflowId || uuidv7(),
    activityId: spec.activityId || uuidv7(),
    activityType: spec.type,
    input: spec.payload ?? toJsonPayload(spec.input ?? {}),
    delay: toDuration(spec.delayMs),
    retryPolicy: policy && {
      maxAttempts: policy.maxAttempts ?? 0,
      initialInterval: toDuration(policy.initialIntervalMs),
      backoffCoefficient: policy.backoffCoefficient ?? 0,
      maxInterval: toDuration(policy.maxIntervalMs),
      nonRetryableErrorTypes: policy.nonRetryableErrorTypes ?? [],
    },
    heartbeatTimeout: toDuration(spec.heartbeatTimeoutMs),
    startToCloseTimeout: toDuration(spec.startToCloseTimeoutMs),
    scheduleToCloseTimeout: toDuration(spec.scheduleToCloseTimeoutMs),
    priority: spec.priority ?? 0,
    headers: { ...spec.headers },
    concurrencyKey: spec.concurrencyKey ?? "",
    fairnessKey: spec.fairnessKey ?? "",
    fairnessWeight: spec.fairnessWeight ?? 0,
  };
}
