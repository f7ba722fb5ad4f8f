// The client against the real server: every submit option stored, idempotent
// submits and conflicts with their gRPC codes, batches all or nothing, reads,
// waits, cancels and re-drives, pages of a listing, stats, and typed execute.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  ActivityFailedError,
  ActivityStatus,
  Client,
  defineActivity,
  SpoolError,
  status,
  type Activity,
} from "../src/index.js";
import { fastRetries, freePort, sharedServer, SpoolServer, TestWorker } from "./harness.js";

let server: SpoolServer;
let client: Client;
sharedServer((s, c) => {
  server = s;
  client = c;
});

/** The error `promise` rejects with, which must be a SpoolError. */
async function refusal(promise: Promise<unknown>): Promise<SpoolError> {
  const e = await promise.then(
    () => assert.fail("expected a refusal"),
    (e: unknown) => e,
  );
  assert.ok(e instanceof SpoolError, String(e));
  return e;
}

test("every submit option is stored", async () => {
  const before = Date.now();
  const { activity, created } = await client.submit({
    type: "options",
    input: { hello: "world" },
    namespace: "opts",
    workflowId: "wf",
    activityId: "all",
    delayMs: 60_000,
    retryPolicy: { maxAttempts: 4, initialIntervalMs: 50, backoffCoefficient: 1.5, maxIntervalMs: 1_000, nonRetryableErrorTypes: ["Fatal"] },
    heartbeatTimeoutMs: 5_000,
    startToCloseTimeoutMs: 10_000,
    scheduleToCloseTimeoutMs: 120_000,
    priority: 3,
    headers: { tenant: "acme" },
    concurrencyKey: "customer-7",
    fairnessKey: "tenant-a",
    fairnessWeight: 2,
  });
  assert.equal(created, true);
  const stored = await client.get({ namespace: "opts", workflowId: "wf", activityId: "all" });
  assert.equal(stored.activityType, "options");
  assert.equal(stored.status, ActivityStatus.ACTIVITY_STATUS_SCHEDULED);
  assert.deepEqual(JSON.parse(stored.input!.data.toString()), { hello: "world" });
  assert.equal(stored.maxAttempts, 4);
  assert.deepEqual(stored.headers, { tenant: "acme" });
  assert.equal(stored.concurrencyKey, "customer-7");
  assert.equal(stored.fairnessKey, "tenant-a");
  assert.ok(stored.nextAt!.getTime() >= before + 59_000, `delayed: ${stored.nextAt?.toISOString()}`);
  assert.deepEqual(stored.key, activity!.key);
});

test("a submit is idempotent by key; another type is ALREADY_EXISTS", async () => {
  const first = await client.submit({ type: "once", workflowId: "idem", activityId: "a", input: 1 });
  const again = await client.submit({ type: "once", workflowId: "idem", activityId: "a", input: 2 });
  assert.equal(first.created, true);
  assert.equal(again.created, false);
  assert.deepEqual(JSON.parse(again.activity!.input!.data.toString()), 1, "the stored activity is answered");
  const conflict = await refusal(client.submit({ type: "other", workflowId: "idem", activityId: "a" }));
  assert.equal(conflict.code, status.ALREADY_EXISTS);
  assert.equal(conflict.codeName, "ALREADY_EXISTS");
});

test("empty ids are generated as UUIDv7", async () => {
  const { activity } = await client.submit({ type: "anon" });
  const v7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
  assert.match(activity!.key!.workflowId, v7);
  assert.match(activity!.key!.activityId, v7);
  assert.equal(activity!.key!.namespace, "default");
});

test("a batch is stored all or nothing", async () => {
  const results = await client.submitBatch([
    { type: "batched", workflowId: "batch", activityId: "1" },
    { type: "batched", workflowId: "batch", activityId: "2" },
    { type: "batched", workflowId: "batch", activityId: "1" },
  ]);
  assert.deepEqual(
    results.map((r) => [r.activity!.key!.activityId, r.created]),
    [
      ["1", true],
      ["2", true],
      ["1", false],
    ],
  );
  const bad = await refusal(
    client.submitBatch([
      { type: "batched", workflowId: "batch", activityId: "3" },
      { type: "batched", workflowId: "batch", activityId: "4", fairnessWeight: 5_000 },
    ]),
  );
  assert.equal(bad.code, status.INVALID_ARGUMENT);
  const missing = await refusal(client.get({ workflowId: "batch", activityId: "3" }));
  assert.equal(missing.code, status.NOT_FOUND, "nothing of the refused batch was stored");
});

test("a wait with a timeout answers the activity as it is then", async () => {
  await client.submit({ type: "nobody-runs-this", workflowId: "wait", activityId: "w" });
  const started = Date.now();
  const waited = await client.wait({ workflowId: "wait", activityId: "w" }, { timeoutMs: 200 });
  assert.equal(waited.status, ActivityStatus.ACTIVITY_STATUS_SCHEDULED);
  assert.ok(Date.now() - started >= 150);
});

test("cancel ends a waiting activity, retry re-drives it, a cancel of a finished one is refused", async () => {
  const key = { workflowId: "manage", activityId: "m" };
  await client.submit({ type: "managed", ...key, retryPolicy: fastRetries(1) });
  const cancelled = await client.cancel(key, "changed my mind");
  assert.equal(cancelled.status, ActivityStatus.ACTIVITY_STATUS_CANCELLED);
  const again = await refusal(client.cancel(key));
  assert.equal(again.code, status.FAILED_PRECONDITION);
  const redriven = await client.retry(key);
  assert.equal(redriven.status, ActivityStatus.ACTIVITY_STATUS_SCHEDULED);
  const busy = await refusal(client.retry(key));
  assert.equal(busy.code, status.FAILED_PRECONDITION);
});

test("list pages through everything, in both orders, filtered", async () => {
  const ids = Array.from({ length: 25 }, (_, i) => `l${String(i).padStart(2, "0")}`);
  await client.submitBatch(ids.map((id) => ({ type: "listed", namespace: "list", workflowId: "wf", activityId: id })));
  const pages: Activity[][] = [];
  for await (const page of client.list({ namespace: "list", type: "listed", pageSize: 10 })) pages.push(page.activities);
  assert.deepEqual(
    pages.map((p) => p.length),
    [10, 10, 5],
  );
  assert.deepEqual(
    pages.flat().map((a) => a.key!.activityId),
    ids,
  );
  const newest: string[] = [];
  for await (const page of client.list({ namespace: "list", pageSize: 7, newestFirst: true })) {
    newest.push(...page.activities.map((a) => a.key!.activityId));
  }
  assert.deepEqual(newest, [...ids].reverse());
  let completed = 0;
  for await (const page of client.list({ namespace: "list", status: ActivityStatus.ACTIVITY_STATUS_COMPLETED })) completed += page.activities.length;
  assert.equal(completed, 0);
  const stats = await client.stats("list");
  assert.equal(stats.scheduled, 25);
  assert.equal(stats.running, 0);
});

const Greet = defineActivity<{ name: string }, string>("greet");

test("execute answers the typed output, or an ActivityFailedError with the activity", async () => {
  const w = new TestWorker({ address: server.address });
  w.worker.register(Greet, (_ctx, { name }) => {
    if (name === "") throw new RangeError("a name is needed");
    return `hello ${name}`;
  });
  w.start();
  try {
    assert.equal(await client.execute(Greet, { name: "Ada" }), "hello Ada");
    const failed = await client
      .execute(Greet, { name: "" }, { retryPolicy: fastRetries(1) })
      .then(() => assert.fail("expected a failure"), (e: unknown) => e);
    assert.ok(failed instanceof ActivityFailedError);
    assert.equal(failed.activity.status, ActivityStatus.ACTIVITY_STATUS_FAILED);
    assert.equal(failed.activity.lastError?.type, "RangeError");
    const handle = await client.start(Greet, { name: "Grace" }, { workflowId: "typed", activityId: "h" });
    assert.equal(await handle.result(), "hello Grace");
    assert.equal((await client.start(Greet, { name: "Grace" }, { workflowId: "typed", activityId: "h" })).created, false);
    const info = await client.serverInfo();
    assert.deepEqual(info.protocolVersions, [1]);
    assert.ok(info.maxPayloadBytes > 0);
  } finally {
    await w.stop();
  }
});

test("no server answering is UNAVAILABLE, after the configured tries", async () => {
  const nowhere = new Client({ address: `127.0.0.1:${await freePort()}`, retry: { attempts: 2, initialDelayMs: 10 } });
  try {
    const e = await refusal(nowhere.stats());
    assert.equal(e.code, status.UNAVAILABLE);
  } finally {
    nowhere.close();
  }
});
