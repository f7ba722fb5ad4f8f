// One attempt: its context made from the task, the handler run with whatever it
// throws caught, and its outcome cut to what the server takes before it is
// reported. Every task gets exactly one result from here, whatever the handler
// does (returns, throws, rejects, throws synchronously).
import { ActivityError } from "./activity-error.js";
import { ActivityContext, infoOf, type HeartbeatSink } from "./context.js";
import type { Payload } from "../gen/spool/v1/common.js";
import type { ActivityResult, ActivityTask } from "../gen/spool/v1/worker.js";

type Outcome = NonNullable<ActivityResult["outcome"]>;

/** A registered handler at the wire's level: a payload in, a payload out. */
export type RawHandler = (ctx: ActivityContext, input: Payload) => Promise<Payload>;

/** What the server keeps of an error's type and message; longer ones are cut here
 * too, since a message over the transport's limit would fail every stream it is
 * sent on. */
export const ERROR_TYPE_BYTES = 255;
export const ERROR_MESSAGE_BYTES = 32 * 1024;

/** Whether `bytes` is over the server's payload limit (0: unknown, nothing is). */
export function tooLarge(bytes: number, limit: number): boolean {
  return limit > 0 && bytes > limit;
}

/** `text` cut to at most `max` UTF-8 bytes, on a character boundary. */
export function cut(text: string, max: number): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= max) return text;
  let end = max;
  // Back off continuation bytes (10xxxxxx) to the start of a character.
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString("utf8");
}

/** The outcome as the server takes it: an output over its payload limit becomes
 * a terminal error, an error is cut to what the server keeps. */
export function asSent(outcome: Outcome, maxPayload: number): Outcome {
  if (outcome.$case === "output" && tooLarge(outcome.value.data.length, maxPayload)) {
    return ActivityError.terminal(
      "PayloadTooLarge",
      `the output is ${outcome.value.data.length} bytes, over the server's limit of ${maxPayload} bytes (--max-payload-bytes); it was not sent`,
    ).toOutcome();
  }
  if (outcome.$case !== "error") return outcome;
  const e = { ...outcome.value };
  e.type = cut(e.type, ERROR_TYPE_BYTES);
  e.message = cut(e.message, ERROR_MESSAGE_BYTES);
  if (e.details && tooLarge(e.details.data.length, maxPayload)) {
    e.details = undefined;
    e.message += " (its details were over the server's payload limit and were left out)";
  }
  return { $case: "error", value: e };
}

/** Runs `task` with `handler` (undefined: none for its type) and resolves with
 * its one result. */
export async function runAttempt(
  task: ActivityTask,
  handler: RawHandler | undefined,
  signal: AbortSignal,
  beat: HeartbeatSink,
  maxPayload: number,
): Promise<ActivityResult> {
  let outcome: Outcome;
  if (handler === undefined) {
    outcome = ActivityError.retryable("NoHandler", `this worker has no handler for ${JSON.stringify(task.activityType)}`).toOutcome();
  } else {
    const ctx = new ActivityContext(infoOf(task), signal, task.lastHeartbeatDetails, beat);
    try {
      const input = task.input ?? { contentType: "", data: Buffer.alloc(0) };
      outcome = { $case: "output", value: await handler(ctx, input) };
    } catch (thrown) {
      outcome = ActivityError.from(thrown).toOutcome();
    }
  }
  return {
    workflowId: task.workflowId,
    activityId: task.activityId,
    attempt: task.attempt,
    outcome: asSent(outcome, maxPayload),
  };
}
