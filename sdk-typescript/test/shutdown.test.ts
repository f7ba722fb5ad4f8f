// SIGTERM to a worker process, as a deploy sends it: runUntilSignal says
// Goodbye, takes no new work (a task already on its way is handed back,
// uncounted), finishes what runs, reports it, and the process exits 0.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { ActivityStatus } from "../src/index.js";
import { eventually, fastRetries, packageRoot, SpoolServer, TestWorker } from "./harness.js";

test("SIGTERM: the worker finishes what it runs, hands back new work, and exits 0", async () => {
  const server = await SpoolServer.start();
  const client = server.client();
  const child = spawn(process.execPath, [join(packageRoot, "build/test/fixtures/leaving-worker.js")], {
    env: { ...process.env, SPOOL_ADDRESS: server.address },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const lines: string[] = [];
  createInterface({ input: child.stdout! }).on("line", (l) => lines.push(l));
  const exited = new Promise<number | null>((ok) => child.once("exit", (code) => ok(code)));
  let stayer: TestWorker | undefined;
  try {
    await eventually("the worker to connect", () => (lines.includes("connected") ? true : undefined));
    await client.submit({ type: "job", input: { ms: 1_000 }, workflowId: "wf", activityId: "x", retryPolicy: fastRetries(1) });
    await eventually("x to start", () => (lines.includes("started x") ? true : undefined));
    child.kill("SIGTERM");
    await new Promise((r) => setTimeout(r, 50));
    // The leaving worker has a free slot but said Goodbye: y waits for the
    // stayer (or, sent before the Goodbye landed, is handed back); either way
    // its only attempt is not spent.
    await client.submit({ type: "job", input: { ms: 0 }, workflowId: "wf", activityId: "y", retryPolicy: fastRetries(1) });
    await new Promise((r) => setTimeout(r, 100));
    stayer = new TestWorker({ address: server.address });
    stayer.worker.register("job", () => "the stayer");
    stayer.start();
    const x = await client.wait({ workflowId: "wf", activityId: "x" });
    assert.equal(x.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED, "x ran to the end on the leaving worker");
    assert.equal(x.attempt, 1);
    assert.equal(JSON.parse(x.output!.data.toString()), "the leaving worker");
    const y = await client.wait({ workflowId: "wf", activityId: "y" });
    assert.equal(y.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED, "handing back does not spend y's only attempt");
    assert.equal(JSON.parse(y.output!.data.toString()), "the stayer");
    assert.equal(await exited, 0);
    assert.ok(!lines.includes("started y"));
    assert.equal(lines.at(-1), "stopped");
  } finally {
    child.kill("SIGKILL");
    await stayer?.stop();
    client.close();
    await server.stop();
  }
});
