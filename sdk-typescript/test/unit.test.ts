// The SDK's pure parts, without a server: what an outcome looks like on the
// wire (errors cut to what the server keeps, oversized outputs replaced),
// how thrown values become errors, which session failures are permanent, the
// submit options' mapping, durations, ids, addresses and the backoff.
import assert from "node:assert/strict";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import { ActivityError, InvalidEndpointError, fromJsonPayload, toJsonPayload, EncodeError } from "../src/index.js";
import { asSent, cut, ERROR_MESSAGE_BYTES, ERROR_TYPE_BYTES } from "../src/worker/attempt.js";
import { isPermanent, SessionError } from "../src/worker/session.js";
import { toSubmitRequest } from "../src/client/submit.js";
import { fromDuration, toDuration } from "../src/internal/duration.js";
import { doubled, jittered } from "../src/internal/time.js";
import { uuidv7 } from "../src/internal/uuid.js";
import { dial } from "../src/transport.js";
import { ErrorKind } from "../src/gen/spool/v1/common.js";
import { messagesOf, outboundFor, type SessionStream } from "../src/worker/frames.js";
import { Welcome, type WorkerMessage } from "../src/gen/spool/v1/worker.js";

test("an error's type and message are cut to what the server keeps, on a character boundary", () => {
  const huge = "é".repeat(10 * 1024 * 1024);
  const sent = asSent(ActivityError.retryable("T".repeat(300), huge).toOutcome(), 0);
  assert.equal(sent.$case, "error");
  if (sent.$case !== "error") return;
  assert.equal(Buffer.byteLength(sent.value.type), ERROR_TYPE_BYTES);
  const bytes = Buffer.byteLength(sent.value.message);
  assert.ok(bytes <= ERROR_MESSAGE_BYTES && bytes > ERROR_MESSAGE_BYTES - 2, String(bytes));
  assert.match(sent.value.message, /^é+$/);
  assert.equal(cut("short", 10), "short");
});

test("an output over the server's limit becomes a terminal PayloadTooLarge; large details are dropped", () => {
  const output = asSent({ $case: "output", value: toJsonPayload("x".repeat(100)) }, 50);
  assert.equal(output.$case, "error");
  if (output.$case === "error") {
    assert.equal(output.value.kind, ErrorKind.ERROR_KIND_TERMINAL);
    assert.equal(output.value.type, "PayloadTooLarge");
  }
  const error = asSent(ActivityError.terminal("Big", "details too big", { details: "y".repeat(100) }).toOutcome(), 50);
  assert.ok(error.$case === "error" && error.value.details === undefined && /left out/.test(error.value.message));
  assert.equal(asSent({ $case: "output", value: toJsonPayload(1) }, 0).$case, "output", "0: no limit known");
});

test("thrown values become retryable errors named after their class", () => {
  assert.deepEqual(
    [new TypeError("t"), new (class QuotaExceeded extends Error {})("q"), "a string", 42].map((t) => {
      const e = ActivityError.from(t);
      return [e.kind, e.type];
    }),
    [
      ["retryable", "TypeError"],
      ["retryable", "QuotaExceeded"],
      ["retryable", "Error"],
      ["retryable", "Error"],
    ],
  );
  const snooze = ActivityError.snooze(1_500).toOutcome();
  assert.deepEqual(snooze, { $case: "snooze", value: { seconds: 1, nanos: 500_000_000 } });
  const retry = ActivityError.retryable("Busy", "later", { nextRetryDelayMs: 250 }).toOutcome();
  assert.ok(retry.$case === "error" && retry.value.nextRetryDelay?.nanos === 250_000_000);
});

test("a refused Hello is permanent; a stream broken before its Hello is not", () => {
  const refused = (code: status, details: string) => new SessionError(details, code, details);
  assert.equal(isPermanent(refused(status.INVALID_ARGUMENT, "no Hello within 10s of opening the stream")), false);
  assert.equal(isPermanent(refused(status.INVALID_ARGUMENT, "the stream failed before Hello: h2 reset")), false);
  assert.equal(isPermanent(refused(status.INVALID_ARGUMENT, 'namespace "bad ns" is not valid')), true);
  assert.equal(isPermanent(refused(status.UNAUTHENTICATED, "no token")), true);
  assert.equal(isPermanent(refused(status.UNAVAILABLE, "the server is draining")), false);
  assert.equal(isPermanent(new SessionError("closed before Welcome", undefined, "")), false);
});

test("every submit option reaches the request", () => {
  const r = toSubmitRequest({
    type: "t",
    input: { a: 1 },
    namespace: "ns",
    workflowId: "wf",
    activityId: "a",
    delayMs: 1_500,
    retryPolicy: { maxAttempts: 3, initialIntervalMs: 10, backoffCoefficient: 2, maxIntervalMs: 60_000, nonRetryableErrorTypes: ["X"] },
    heartbeatTimeoutMs: 1,
    startToCloseTimeoutMs: 2,
    scheduleToCloseTimeoutMs: 3,
    priority: -2,
    headers: { h: "v" },
    concurrencyKey: "c",
    fairnessKey: "f",
    fairnessWeight: 9,
  });
  assert.deepEqual(r, {
    namespace: "ns",
    workflowId: "wf",
    activityId: "a",
    activityType: "t",
    input: { contentType: "application/json", data: Buffer.from('{"a":1}') },
    delay: { seconds: 1, nanos: 500_000_000 },
    retryPolicy: {
      maxAttempts: 3,
      initialInterval: { seconds: 0, nanos: 10_000_000 },
      backoffCoefficient: 2,
      maxInterval: { seconds: 60, nanos: 0 },
      nonRetryableErrorTypes: ["X"],
    },
    heartbeatTimeout: { seconds: 0, nanos: 1_000_000 },
    startToCloseTimeout: { seconds: 0, nanos: 2_000_000 },
    scheduleToCloseTimeout: { seconds: 0, nanos: 3_000_000 },
    priority: -2,
    headers: { h: "v" },
    concurrencyKey: "c",
    fairnessKey: "f",
    fairnessWeight: 9,
  });
  const bare = toSubmitRequest({ type: "t" });
  assert.equal(bare.retryPolicy, undefined);
  assert.notEqual(bare.workflowId, "", "ids filled in before the first try");
});

test("durations, ids, payloads, addresses and the backoff", () => {
  assert.equal(fromDuration(toDuration(1234.5)), 1234.5);
  assert.equal(toDuration(undefined), undefined);
  assert.throws(() => toDuration(-1), RangeError);
  const a = uuidv7(1_700_000_000_000);
  assert.match(a, /^018bcfe5-6800-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.ok(uuidv7(1) < uuidv7(2), "sorted by time");
  assert.equal(fromJsonPayload(toJsonPayload(undefined)), null);
  assert.throws(() => toJsonPayload(10n), EncodeError);
  assert.equal(dial({ address: "http://127.0.0.1:7070" }).target, "127.0.0.1:7070");
  assert.equal(dial({ address: "https://spool.example:443/" }).target, "spool.example:443");
  assert.throws(() => dial({ address: "127.0.0.1:7070", tls: {} }), InvalidEndpointError);
  assert.throws(() => dial({ address: "h:1", token: "two words" }), InvalidEndpointError);
  assert.equal(dial({ address: "h:1", token: "t" }).metadata().get("authorization")[0], "Bearer t");
  assert.equal(jittered(2_000, 0), 1_000);
  assert.equal(jittered(2_000, 1), 2_000);
  assert.equal(doubled(3_000, 5_000), 5_000);
});

test("batched frames: tasks and acks unpack in order; results of one turn leave as one frame, after nothing sent later", async () => {
  const task = (activityId: string) => ({ activityId }) as never;
  const unpacked = messagesOf({ message: { $case: "tasks", value: { tasks: [task("a"), task("b")] } } });
  assert.deepEqual(
    unpacked.map((m) => (m.message?.$case === "task" ? m.message.value.activityId : "?")),
    ["a", "b"],
  );
  const written: WorkerMessage[] = [];
  const stream = { write: (m: WorkerMessage) => written.push(m), end: () => {}, writableEnded: false, destroyed: false };
  const result = (activityId: string) => ({
    message: { $case: "result" as const, value: { workflowId: "wf", activityId, attempt: 1, outcome: undefined } },
  });
  // A server that does not say it reads batches gets one result a frame.
  const single = outboundFor(stream as unknown as SessionStream, Welcome.fromPartial({}));
  single.send(result("a"));
  single.send(result("b"));
  assert.deepEqual(written.map((m) => m.message?.$case), ["result", "result"]);
  written.length = 0;
  const batched = outboundFor(stream as unknown as SessionStream, Welcome.fromPartial({ batches: true }));
  batched.send(result("a"));
  batched.send(result("b"));
  assert.equal(written.length, 0, "held until the turn ends");
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(written.length, 1);
  const frame = written[0]!.message;
  assert.equal(frame?.$case, "results");
  if (frame?.$case === "results") assert.deepEqual(frame.value.results.map((r) => r.activityId), ["a", "b"]);
  // Large outputs leave before the turn ends, so no frame grows past the bound.
  written.length = 0;
  const large = (activityId: string) => ({
    message: {
      $case: "result" as const,
      value: {
        workflowId: "wf",
        activityId,
        attempt: 1,
        outcome: { $case: "output" as const, value: { data: new Uint8Array(700 * 1024), contentType: "", encoding: "" } as never },
      },
    },
  });
  batched.send(large("l1"));
  assert.equal(written.length, 0, "under the bound: held");
  batched.send(large("l2"));
  assert.equal(written.length, 1, "past the bound: sent at once");
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(written.length, 1, "nothing left behind");
  // Anything else sent goes after the results before it.
  written.length = 0;
  batched.send(result("c"));
  batched.send({ message: { $case: "goodbye", value: {} } });
  assert.deepEqual(written.map((m) => m.message?.$case), ["result", "goodbye"]);
});
