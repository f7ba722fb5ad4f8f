// Retries of UNAVAILABLE (a node draining or restarting, a store failure that
// may pass, no connection yet): the policy a caller sets and the one loop that
// every call safe to send again goes through. Only reads and submits are
// retried; a submit is idempotent by key, and the client fills in empty ids
// before the first try so a retry names the same key.
import { status as Status } from "@grpc/grpc-js";
import { SpoolError } from "../errors.js";
import { doubled, jittered, sleep } from "../internal/time.js";

export interface RetryOptions {
  /** Tries in all, the first included (1: never retry). Default 5. */
  attempts: number;
  /** The wait before the first retry; each next one doubles (default 100 ms). */
  initialDelayMs: number;
  /** The longest wait between tries (default 2 s). */
  maxDelayMs: number;
}

export const defaultRetry: RetryOptions = { attempts: 5, initialDelayMs: 100, maxDelayMs: 2_000 };

/** Runs `call` until it answers, fails with anything but UNAVAILABLE, or the tries are spent. */
export async function retrying<T>(policy: RetryOptions, call: () => Promise<T>): Promise<T> {
  let delay = policy.initialDelayMs;
  for (let tried = 1; ; tried++) {
    try {
      return await call();
    } catch (e) {
      if (!(e instanceof SpoolError) || e.code !== Status.UNAVAILABLE || tried >= policy.attempts) throw e;
      await sleep(jittered(delay));
      delay = doubled(delay, policy.maxDelayMs);
    }
  }
}
