// Bearer tokens and TLS against the real server: a missing or wrong token is
// UNAUTHENTICATED for the client and stops a worker for good (reconnecting
// cannot help); with the token both work; over TLS (certificates made here with
// the openssl command) the client and a worker reach a server with a private CA.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { ActivityStatus, Client, SpoolError, status, Worker, WorkerError, silentLogger } from "../src/index.js";
import { SpoolServer, TestWorker } from "./harness.js";

const TOKEN = "a-token-of-at-least-16-characters";

test("with --auth-token, calls and sessions need the bearer token", async () => {
  const server = await SpoolServer.start({ args: ["--auth-token", TOKEN] }).catch((e: Error) => e);
  // The harness's readiness probe has no token: it must see the server anyway.
  assert.ok(server instanceof SpoolServer, String(server));
  const anonymous = new Client({ address: server.address, retry: { attempts: 1 } });
  const wrong = new Client({ address: server.address, token: "not-the-token-at-all", retry: { attempts: 1 } });
  const client = new Client({ address: server.address, token: TOKEN });
  try {
    for (const c of [anonymous, wrong]) {
      const e = await c.stats().then(
        () => assert.fail("expected UNAUTHENTICATED"),
        (e: unknown) => e,
      );
      assert.ok(e instanceof SpoolError);
      assert.equal(e.code, status.UNAUTHENTICATED);
    }
    const refused = await new Worker({ address: server.address, token: "not-the-token-at-all", logger: silentLogger })
      .register("secured", () => "no")
      .run()
      .then(
        () => assert.fail("expected the worker to stop"),
        (e: unknown) => e,
      );
    assert.ok(refused instanceof WorkerError, String(refused));
    assert.equal(refused.kind, "Rejected");
    assert.equal(refused.code, status.UNAUTHENTICATED);

    const w = new TestWorker({ address: server.address, token: TOKEN });
    w.worker.register("secured", () => "yes");
    w.start();
    try {
      await client.submit({ type: "secured", workflowId: "wf", activityId: "s" });
      const done = await client.wait({ workflowId: "wf", activityId: "s" });
      assert.equal(done.status, ActivityStatus.ACTIVITY_STATUS_COMPLETED);
    } finally {
      await w.stop();
    }
  } finally {
    anonymous.close();
    wrong.close();
    client.close();
    await server.stop();
  }
});

/** A CA and a server certificate for 127.0.0.1 and localhost, signed by it. */
function certificates(dir: string): { ca: string; cert: string; key: string } {
  const openssl = (...args: string[]): void => {
    execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
  };
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
  openssl("req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=spool-ts-test-ca");
  openssl("req", ...ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost");
  writeFileSync(join(dir, "san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
  openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "server.pem", "-days", "1", "-extfile", "san.ext");
  return { ca: join(dir, "ca.pem"), cert: join(dir, "server.pem"), key: join(dir, "server.key") };
}

let hasOpenssl = true;
try {
  execFileSync("openssl", ["version"], { stdio: "ignore" });
} catch {
  hasOpenssl = false;
}

test("over TLS with a private CA, the client and a worker reach the server", { skip: hasOpenssl ? false : "needs the openssl command" }, async () => {
  const dir = mkdtempSync(join(tmpdir(), "spool-ts-pki-"));
  const pki = certificates(dir);
  const server = await SpoolServer.start({ args: ["--tls-cert", pki.cert, "--tls-key", pki.key], tls: { ca: readFileSync(pki.ca) } });
  const client = new Client({ address: `https://localhost:${server.port}`, tls: { ca: readFileSync(pki.ca) } });
  const w = new TestWorker({ address: `https://localhost:${server.port}`, tls: { ca: readFileSync(pki.ca) } });
  w.worker.register("tls", () => "private");
  w.start();
  try {
    assert.deepEqual((await client.serverInfo()).protocolVersions, [1]);
    await client.submit({ type: "tls", workflowId: "wf", activityId: "t" });
    const done = await client.wait({ workflowId: "wf", activityId: "t" });
    assert.equal(JSON.parse(done.output!.data.toString()), "private");
    // Without the CA, the server's certificate is not trusted: no connection.
    const untrusting = new Client({ address: `https://localhost:${server.port}`, retry: { attempts: 1 } });
    const e = await untrusting.stats().then(
      () => assert.fail("expected a refusal"),
      (e: unknown) => e,
    );
    untrusting.close();
    assert.ok(e instanceof SpoolError && e.code === status.UNAVAILABLE, String(e));
  } finally {
    await w.stop();
    client.close();
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
