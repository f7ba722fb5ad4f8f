// The contract between the services that submit an activity and the workers
// that run it: its type name, input and output types (JSON on the wire), shared
// as one `defineActivity` value so a mismatch is a compile error; and the
// payload encoding both sides use.
import type { Payload } from "./gen/spool/v1/common.js";

const JSON_TYPE = "application/json";

/** A typed activity: `defineActivity<Input, Output>("email.send")`. */
export interface ActivityDefinition<I, O> {
  readonly name: string;
  /**
   * Checks and converts the decoded JSON input (a schema library's `parse`, say);
   * throwing fails the activity for good as `BadInput`.
   */
  readonly input?: (json: unknown) => I;
  /** Checks and converts the decoded JSON output on the client's side. */
  readonly output?: (json: unknown) => O;
  /** Types only: never set. */
  readonly __types?: { input: I; output: O };
}

export function defineActivity<I, O>(
  name: string,
  check: { input?: (json: unknown) => I; output?: (json: unknown) => O } = {},
): ActivityDefinition<I, O> {
  return { name, ...check };
}

/** The input type of an activity definition. */
export type InputOf<A> = A extends ActivityDefinition<infer I, unknown> ? I : never;
/** The output type of an activity definition. */
export type OutputOf<A> = A extends ActivityDefinition<unknown, infer O> ? O : never;

/** Thrown by `toJsonPayload` for a value JSON cannot hold (a BigInt, a cycle). */
export class EncodeError extends Error {
  override readonly name = "EncodeError";
}

/** Thrown by `fromJsonPayload` for a payload that is not JSON. */
export class DecodeError extends Error {
  override readonly name = "DecodeError";
}

/** `value` as a JSON payload; `undefined` is encoded as `null`. */
export function toJsonPayload(value: unknown): Payload {
  let text: string | undefined;
  try {
    text = JSON.stringify(value === undefined ? null : value);
  } catch (e) {
    throw new EncodeError(`cannot be encoded as JSON: ${(e as Error).message}`, { cause: e });
  }
  // JSON.stringify answers undefined for a function or a symbol.
  if (text === undefined) throw new EncodeError(`a ${typeof value} cannot be encoded as JSON`);
  return { contentType: JSON_TYPE, data: Buffer.from(text, "utf8") };
}

/** The JSON value of `payload`; an empty payload is `undefined`. */
export function fromJsonPayload(payload: Payload | undefined): unknown {
  if (!payload || payload.data.length === 0) return undefined;
  if (payload.contentType !== "" && !payload.contentType.startsWith(JSON_TYPE)) {
    throw new DecodeError(`the payload is ${payload.contentType}, not JSON`);
  }
  try {
    return JSON.parse(payload.data.toString("utf8"));
  } catch (e) {
    throw new DecodeError(`the payload is not valid JSON: ${(e as Error).message}`, { cause: e });
  }
}
