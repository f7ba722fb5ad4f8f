// The worker against the real server, the Rust SDK's e2e scenarios: retries,
// terminal errors and bad input, snoozes, the previous attempt's heartbeat
// details, a cancel reaching the handler with its reason, and a server's drain.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ActivityError, ActivityStatus, CancelledError, defineActivity, type Client } from "../src/index.js";
import { eventually, fastRetries, sharedServer, SpoolServer, TestWorker } from "./harness.js";

let server: SpoolServer;
let client: Client;
sharedServer((s, c) => {
  server = s;
  client = c;
});

/** A worker on the shared server with `setup`'s handlers, stopped after `body`. */
async function withWorker(setup: (w: TestWorker) => void, body: (w: TestWorker) => Promise<void>): Promise<void> {
  const w = new TestWorker({ address: server.address });
  setup(w);
  w.start();
  try {
    await body(w);
  } finally {
    await w.stop();
  }
}

const Add = defineActivity<{ a: number; b: number }, number>("add", {
  input: (json) => {
    const v = json as { a: unknown; b: unknown };
    if (typeof v?.a !== "number" || typeof v?.b !== "number") throw new TypeError("a and b must be numbers");
    return { a: v.a, b: v.b };
  },
});

test("a typed activity round-trips and bad input fails it for good", async () => {
  await withWorker(
    (w) => w.worker.register(Add, (_ctx, { a, b }) => a + b),
    async () => {
      assert.equal(await client.execute(Add, { a: 2, b: 40 }, { workflowId: "wf", activityId: "sum" }), 42);
      await client.submit({ type: "add", input: { a: "two" }, workflowId: "wf", activityId: "bad", retryPolicy: fastRetries(3) });
      const failed = await client.wait({ workflowId: "wf", activityId: "bad" });
      assert.equal(failed.status, ActivityStatus.ACTIVITY_STATUS_FAILED);
      assert.equal(failed.attempt, 1);
      assert.equal(failed.lastError?.type, "BadInput");
      assert.match(failed.lastError!.message, /a and b must be numbers/);
    },
  );
});

test("thrown errors are retried, then it completes on the third attempt", async () => {
  const runs: number[] = [];
  await withWorker(
    (w) =>
      w.worker.register("flaky", (ctx) => {
        runs.push(ctx.info.attempt);
        if (ctx.info.attempt === 1) JSON.parse("not json"); // a SyntaxError
        if (ctx.info.attempt === 2) throw ActivityError.retryable("Busy", "try later", { nextRetryDelayMs: 10 });
        return "third time lucky";
      }),
    async () => {
      await client.submit({ type: "flaky", workflowId: "wf", activityId: "f", retryPolicy: fastRetries(3) });
      const done = await client.wait({ workflowId: "wf", activityId: "f" });
      assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
      assert.equal(done.attempt, 3);
      assert.deepEqual(runs, [1, 2, 3]);
      assert.equal(done.lastError?.type, "Busy");
      const history = (await client.get({ workflowId: "wf", activityId: "f" }, { history: true })).history;
      assert.deepEqual(
        history.map((h) => [h.outcome, h.error?.type ?? ""]),
        [
          ["retried", "SyntaxError"],
          ["retried", "Busy"],
          ["completed", ""],
        ],
      );
    },
  );
});

test("a terminal error fails the activity at once, with its details", async () => {
  await withWorker(
    (w) => w.worker.register("doomed", () => Promise.reject(ActivityError.terminal("NoSuchUser", "user 7 is gone", { details: { user: 7 } }))),
    async () => {
      await client.submit({ type: "doomed", workflowId: "wf", activityId: "t", retryPolicy: fastRetries(5) });
      const failed = await client.wait({ workflowId: "wf", activityId: "t" });
      assert.equal(failed.status, ActivityStatus.ACTIVITY_STATUS_FAILED);
      assert.equal(failed.attempt, 1);
      assert.equal(failed.lastError?.type, "NoSuchUser");
      assert.deepEqual(JSON.parse(failed.lastError!.details!.data.toString()), { user: 7 });
    },
  );
});

test("a snooze runs again later without spending an attempt", async () => {
  await withWorker(
    (w) =>
      w.worker.register("patient", (ctx) => {
        if (ctx.info.attempt === 1) throw ActivityError.snooze(50);
        return { attempt: ctx.info.attempt, counted: ctx.info.countedAttempts, last: ctx.info.isLastAttempt };
      }),
    async () => {
      await client.submit({ type: "patient", workflowId: "wf", activityId: "s", retryPolicy: fastRetries(1) });
      const done = await client.wait({ workflowId: "wf", activityId: "s" });
      assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
      assert.deepEqual(JSON.parse(done.output!.data.toString()), { attempt: 2, counted: 0, last: true });
    },
  );
});

test("the previous attempt's heartbeat details reach the next attempt", async () => {
  const seen: [number, number | undefined, boolean][] = [];
  await withWorker(
    (w) =>
      w.worker.register("resumable", async (ctx) => {
        const from = ctx.lastHeartbeat<number>();
        seen.push([ctx.info.attempt, from, ctx.info.isLastAttempt]);
        if (ctx.info.attempt === 1) {
          ctx.heartbeat(7);
          throw ActivityError.retryable("Interrupted", "try again");
        }
        return from;
      }),
    async () => {
      await client.submit({ type: "resumable", workflowId: "wf", activityId: "r", retryPolicy: fastRetries(2) });
      const done = await client.wait({ workflowId: "wf", activityId: "r" });
      assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
      assert.deepEqual(seen, [
        [1, undefined, false],
        [2, 7, true],
      ]);
    },
  );
});

test("a cancel reaches the handler promptly with its reason; a timeout says so", async () => {
  const reasons = new Map<string, CancelledError>();
  const started = new Set<string>();
  await withWorker(
    (w) =>
      w.worker.register("long", async (ctx) => {
        started.add(ctx.info.activityId);
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve, { once: true }));
        reasons.set(ctx.info.activityId, ctx.signal.reason as CancelledError);
        ctx.signal.throwIfAborted();
      }),
    async () => {
      await client.submit({ type: "long", workflowId: "cancel", activityId: "c" });
      await eventually("the attempt to start", () => (started.has("c") ? true : undefined));
      const cancelledAt = performance.now();
      const cancelled = await client.cancel({ workflowId: "cancel", activityId: "c" }, "not needed any more");
      assert.equal(cancelled.status, ActivityStatus.ACTIVITY_STATUS_CANCELLED);
      const reason = await eventually("the handler to see the cancel", () => reasons.get("c"));
      assert.ok(performance.now() - cancelledAt < 1_000, "promptly");
      assert.ok(reason instanceof CancelledError);
      assert.equal(reason.kind, "requested");
      assert.equal(reason.message, "not needed any more");

      await client.submit({ type: "long", workflowId: "cancel", activityId: "t", startToCloseTimeoutMs: 300, retryPolicy: fastRetries(1) });
      const timedOut = await eventually("the timeout to reach the handler", () => reasons.get("t"));
      assert.equal(timedOut.kind, "timed_out");
      assert.match(timedOut.message, /start_to_close/);
      const failed = await client.wait({ workflowId: "cancel", activityId: "t" });
      assert.equal(failed.status, ActivityStatus.ACTIVITY_STATUS_FAILED);
    },
  );
});

test("on the server's drain the worker finishes what runs, reports it, and comes back after resume", async () => {
  let release!: () => void;
  const gate = new Promise<void>((r) => (release = r));
  const started: string[] = [];
  await withWorker(
    (w) =>
      w.worker.register("gated", async (ctx) => {
        started.push(ctx.info.activityId);
        if (ctx.info.activityId === "d1") await gate;
        return ctx.info.activityId;
      }),
    async (w) => {
      await w.connected();
      await client.submit({ type: "gated", workflowId: "wf", activityId: "d1" });
      await eventually("d1 to start", () => (started.includes("d1") ? true : undefined));
      const drained = client.drain(10_000);
      // The drain waits for d1; the worker takes no new work meanwhile.
      await new Promise((r) => setTimeout(r, 300));
      await client.submit({ type: "gated", workflowId: "wf", activityId: "d2" });
      release();
      const report = await drained;
      assert.equal(report.completed, 1, JSON.stringify(report));
      const d1 = await client.get({ workflowId: "wf", activityId: "d1" });
      assert.equal(d1.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
      assert.equal(d1.attempt, 1);
      assert.ok(!started.includes("d2"), "no task while draining");
      assert.equal(await client.resume(), true);
      const d2 = await client.wait({ workflowId: "wf", activityId: "d2" });
      assert.equal(d2.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED, "the worker reconnected after the resume");
    },
  );
});
