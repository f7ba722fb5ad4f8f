// Conversions between the SDK's milliseconds and the wire's
// google.protobuf.Duration. The SDK speaks milliseconds (JavaScript's unit for
// timers and dates); the wire speaks seconds and nanoseconds.
import type { Duration } from "../gen/google/protobuf/duration.js";

/** `ms` as a wire Duration; `undefined` stays unset (the server's default). */
export function toDuration(ms: number | undefined): Duration | undefined {
  if (ms === undefined) return undefined;
  if (!Number.isFinite(ms) || ms < 0) {
    throw new RangeError(`a duration must be a finite number of milliseconds ≥ 0, not ${ms}`);
  }
  const whole = Math.floor(ms);
  const seconds = Math.floor(whole / 1000);
  const nanos = (whole - seconds * 1000) * 1_000_000 + Math.round((ms - whole) * 1_000_000);
  return { seconds, nanos };
}

/** A wire Duration in milliseconds; unset is `undefined`. */
export function fromDuration(d: Duration | undefined): number | undefined {
  if (d === undefined) return undefined;
  return d.seconds * 1000 + d.nanos / 1_000_000;
}
