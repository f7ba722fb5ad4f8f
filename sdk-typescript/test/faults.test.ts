// Faults with real processes and a real network: a connection cut through a
// TCP proxy resumes the session with no extra delivery (the attempt runs and
// is recorded once), a result made while cut off is recorded once after the
// resume, a server without a resume grace stops the old session's handlers,
// and a kill -9 of the server mid-flight loses no acknowledged activity.
import assert from "node:assert/strict";
import { test } from "node:test";
import { ActivityStatus, CancelledError, type Ack, type Client } from "../src/index.js";
import { eventually, fastRetries, Proxy, SpoolServer, TestWorker } from "./harness.js";

/** A worker through `address` whose `slow` handler sleeps the input's `ms`, deaf
 * to cancellation (work that cannot stop), recording each run and each ack. */
function slowWorker(address: string) {
  const runs: [string, number][] = [];
  const acks: Ack[] = [];
  const cancels: CancelledError[] = [];
  const w = new TestWorker({ address, maxConcurrency: 4 });
  w.worker.register<{ ms: number }, { attempt: number }>("slow", async (ctx, { ms }) => {
    runs.push([ctx.info.activityId, ctx.info.attempt]);
    ctx.signal.addEventListener("abort", () => cancels.push(ctx.signal.reason as CancelledError));
    await new Promise((r) => setTimeout(r, ms));
    return { attempt: ctx.info.attempt };
  });
  w.worker.on("ack", (ack) => acks.push(ack));
  const accepted = (id: string): number => acks.filter((a) => a.activityId === id && a.accepted).length;
  return { w, runs, acks, cancels, accepted };
}

/** A server with a resume grace behind a proxy, and a slow worker through it,
 * started; heartbeats at 1 s, so a cut of a second is not mistaken for a silent
 * worker (three intervals). All is stopped after `body`. */
async function throughProxy(
  grace: string,
  body: (s: { proxy: Proxy; client: Client } & ReturnType<typeof slowWorker>) => Promise<void>,
): Promise<void> {
  const server = await SpoolServer.start({ heartbeatInterval: "1s", args: ["--resume-grace", grace] });
  const proxy = await Proxy.start(server.port);
  const client = server.client();
  const worker = slowWorker(proxy.address);
  worker.w.start();
  try {
    await body({ proxy, client, ...worker });
  } finally {
    await worker.w.stop();
    client.close();
    await proxy.close();
    await server.stop();
  }
}

/** Submits a `slow` activity of `ms` and waits for its first run to start. */
async function started(client: Client, runs: unknown[], activityId: string, ms: number): Promise<void> {
  await client.submit({ type: "slow", input: { ms }, workflowId: "wf", activityId, retryPolicy: fastRetries(5) });
  await eventually("the attempt to start", () => (runs.length > 0 ? true : undefined));
}

test("a cut within the grace costs nothing: resumed, run once, recorded once", () =>
  throughProxy("5s", async ({ proxy, client, w, runs, accepted }) => {
    assert.equal(await w.connected(), false, "a first session");
    await started(client, runs, "a", 3_000);
    await new Promise((r) => setTimeout(r, 500));
    const reconnected = new Promise<boolean>((ok) => {
      const off = w.worker.on("connection", (s) => {
        if (s.state === "connected") {
          off();
          ok(s.resumed);
        }
      });
    });
    proxy.cutOff();
    await new Promise((r) => setTimeout(r, 1_000));
    proxy.up();
    assert.equal(await reconnected, true, "the session was resumed");
    const done = await client.wait({ workflowId: "wf", activityId: "a" });
    assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
    assert.equal(done.attempt, 1);
    assert.deepEqual(runs, [["a", 1]], "run once: no extra delivery");
    await eventually("the result's ack", () => (accepted("a") === 1 ? true : undefined));
    const history = (await client.get({ workflowId: "wf", activityId: "a" }, { history: true })).history;
    assert.equal(history.length, 1, JSON.stringify(history));
  }));

test("a result made while cut off is recorded once after the resume", () =>
  throughProxy("5s", async ({ proxy, client, w, runs, accepted }) => {
    await w.connected();
    await started(client, runs, "b", 500);
    proxy.cutOff();
    // The handler ends while no connection can be made.
    await new Promise((r) => setTimeout(r, 1_200));
    const meanwhile = await client.get({ workflowId: "wf", activityId: "b" });
    assert.equal(meanwhile.status, ActivityStatus.ACTIVITY_STATUS_RUNNING, "waiting for the worker");
    proxy.up();
    const done = await client.wait({ workflowId: "wf", activityId: "b" });
    assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
    assert.equal(done.attempt, 1);
    await eventually("the result's ack", () => (accepted("b") === 1 ? true : undefined));
    assert.deepEqual(runs, [["b", 1]]);
  }));

test("without a grace, the new session stops the old session's handlers", () =>
  throughProxy("0s", async ({ proxy, client, w, runs, cancels }) => {
    await w.connected();
    await started(client, runs, "c", 3_000);
    proxy.cut();
    const cancel = await eventually("the old handler to be told to stop", () => cancels[0]);
    assert.equal(cancel.kind, "ended_elsewhere");
    // The server lost attempt 1 with the stream and runs the activity again.
    const done = await client.wait({ workflowId: "wf", activityId: "c" });
    assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
    assert.equal(done.attempt, 2);
    const history = (await client.get({ workflowId: "wf", activityId: "c" }, { history: true })).history;
    assert.deepEqual(
      history.map((h) => h.outcome),
      ["lost", "completed"],
    );
  }));

test("kill -9 of the server mid-flight: after the restart every activity completes once", async () => {
  const server = await SpoolServer.start();
  const client = server.client();
  const { w, runs, acks } = slowWorker(server.address);
  w.start();
  try {
    await w.connected();
    const ids = ["k1", "k2", "k3"];
    for (const id of ids) {
      await client.submit({ type: "slow", input: { ms: 1_500 }, workflowId: "wf", activityId: id, retryPolicy: fastRetries(5) });
    }
    await eventually("the attempts to start", () => (runs.length === 3 ? true : undefined));
    await server.kill9();
    await new Promise((r) => setTimeout(r, 300));
    await server.restart();
    for (const id of ids) {
      const done = await client.wait({ workflowId: "wf", activityId: id });
      assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED, id);
      // One accepted outcome per activity: the attempt that completed it. (Its
      // ack may reach the worker just after the wait's answer.)
      const accepted = await eventually(`${id}'s ack`, () => {
        const found = acks.filter((a) => a.activityId === id && a.accepted);
        return found.length > 0 ? found : undefined;
      });
      assert.deepEqual(
        accepted.map((a) => a.attempt),
        [done.attempt],
        `${id}: ${JSON.stringify(acks)}`,
      );
    }
    // The worker serves on after the restart.
    await client.submit({ type: "slow", input: { ms: 0 }, workflowId: "wf", activityId: "after" });
    assert.equal((await client.wait({ workflowId: "wf", activityId: "after" })).status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
  } finally {
    await w.stop();
    client.close();
    await server.stop();
  }
});
