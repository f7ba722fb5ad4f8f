// `spool bench`'s drain with a TypeScript worker, on the peers harness's
// workload and process model (docs/BENCHMARKS.md, "peers"): `spool serve` in a
// process of its own (as Redis is for BullMQ), N no-op activities stored in
// batches of BATCH, then one worker of CONC slots in this Node process. Prints
// one JSON line: activities/s from the first handler start to the last
// result's ack (as `spool bench` counts), and to the last handler end (as the
// peers' trackers count), with the CPU of this process and of the server.
//
//   SPOOL_BIN=../target/release/spool N=20000 npm run bench   (BATCHES=0: one message a frame)
import { readFileSync } from "node:fs";
import { silentLogger, Worker } from "../src/index.js";
import { SpoolServer } from "../test/harness.js";

const N = Number(process.env.N ?? 20_000);
const BATCH = Number(process.env.BATCH ?? 1_000);
const CONC = Number(process.env.CONC ?? 50);

/** utime + stime of a process in seconds (`/proc/<pid>/stat` counts 1/100 s). */
function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

const server = await SpoolServer.start({ heartbeatInterval: "5s" });
const client = server.client();
for (let off = 0; off < N; off += BATCH) {
  const specs = [];
  for (let i = off; i < Math.min(N, off + BATCH); i++) specs.push({ type: "noop", input: { i } });
  await client.submitBatch(specs);
}

let first = 0;
let lastEnd = 0;
let acked = 0;
let lastAck = 0;
let resolveDrained!: () => void;
const drained = new Promise<void>((resolve) => (resolveDrained = resolve));
const worker = new Worker({
  address: server.address,
  maxConcurrency: CONC,
  logger: silentLogger,
  batches: process.env.BATCHES !== "0",
});
worker.register("noop", () => {
  const now = performance.now();
  if (first === 0) first = now;
  lastEnd = now;
  return null;
});
worker.on("ack", (ack) => {
  if (!ack.accepted) return;
  acked++;
  if (acked === N) {
    lastAck = performance.now();
    resolveDrained();
  }
});
const stop = new AbortController();
const node0 = process.cpuUsage();
const server0 = cpuSeconds(server.proc.pid!);
const running = worker.run(stop.signal);
await drained;
const nodeUsed = process.cpuUsage(node0);
const nodeCpu = (nodeUsed.user + nodeUsed.system) / 1e6;
const serverCpu = cpuSeconds(server.proc.pid!) - server0;
stop.abort();
await running;
const stats = await client.stats();
if (stats.completed !== N) throw new Error(`${stats.completed} of ${N} completed`);
client.close();
await server.stop();

const seconds = (lastAck - first) / 1000;
console.log(
  JSON.stringify({
    peer: "spool-ts",
    N,
    CONC,
    drain_per_s: Math.round(N / seconds),
    drain_to_last_end_per_s: Math.round(N / ((lastEnd - first) / 1000)),
    drain_s: +seconds.toFixed(3),
    node_cpu_s: +nodeCpu.toFixed(3),
    server_cpu_s: +serverCpu.toFixed(3),
    cpu_per_10k_s: +(((nodeCpu + serverCpu) * 10_000) / N).toFixed(3),
    cores: +((nodeCpu + serverCpu) / seconds).toFixed(2),
  }),
);
