// Timers the worker and client wait on: sleeps that an AbortSignal ends early,
// and the reconnect backoff's arithmetic (spread and doubling), kept pure so
// they are tested without a clock.

/** Resolves after `ms`, or as soon as `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * `delay` spread to between half and all of it (`r` in [0, 1)), so workers that
 * lost a server together do not reconnect together.
 */
export function jittered(delay: number, r: number = Math.random()): number {
  const spread = Math.min(Math.max(r, 0), 1);
  return delay * (0.5 + spread / 2);
}

/** The next backoff delay: twice `delay`, at most `max`. */
export function doubled(delay: number, max: number): number {
  return Math.min(delay * 2, max);
}
