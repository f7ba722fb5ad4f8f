// BullMQ's drain alone, with the CPU it costs: the node process (the Worker)
// and redis-server, read at the drain's first and last instant.
//
// The set-up is the peers harness's (docs/BENCHMARKS.md, "How to reproduce"): Redis
// with AOF `appendfsync everysec`, jobs removed on completion, N no-op jobs
// stored with addBulk in 1,000s, then one Worker with 50 slots. Copy this file
// into the harness's folder (it imports its node_modules), start Redis with its
// `lib/redis.sh start`, then:
//
//   N=20000 node bullmq_drain_cpu.mjs
//
// Prints one JSON line: jobs/s from the first handler start to the last, and
// CPU seconds of node and redis-server over the drain, per 10,000 jobs.
import { Queue, Worker } from 'bullmq';
import IORedis from 'ioredis';
import fs from 'fs';

const N = +(process.env.N || 20000);
const CONC = 50;
const BATCH = 1000;
const connection = { host: '127.0.0.1', port: +(process.env.REDIS_PORT || 56379), maxRetriesPerRequest: null };
const redisPid = +fs.readFileSync(`${process.env.REDIS_DIR || '/tmp/peerbench-redis'}/redis.pid`, 'utf8');

// utime + stime of a process, in seconds (`/proc/<pid>/stat` counts 1/100 s).
const cpuSeconds = (pid) => {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
};

const flush = new IORedis(connection);
await flush.flushdb();
const queue = new Queue('noop', { connection, defaultJobOptions: { removeOnComplete: true, removeOnFail: 1000 } });
await queue.waitUntilReady();
for (let off = 0; off < N; off += BATCH) {
  const jobs = [];
  for (let i = off; i < Math.min(N, off + BATCH); i++) jobs.push({ name: 'noop', data: { i } });
  await queue.addBulk(jobs);
}

let done = 0;
let first = 0;
let last = 0;
const node0 = process.cpuUsage();
const redis0 = cpuSeconds(redisPid);
const started = performance.now();
const worker = new Worker('noop', async () => {
  if (!first) first = performance.now();
  done++;
  last = performance.now();
}, { connection, concurrency: CONC });
while (done < N) await new Promise((resolve) => setTimeout(resolve, 1));
const wall = (performance.now() - started) / 1000;
const nodeUsed = process.cpuUsage(node0);
const node = (nodeUsed.user + nodeUsed.system) / 1e6;
const redis = cpuSeconds(redisPid) - redis0;
console.log(JSON.stringify({
  N,
  drain_per_s: Math.round(N / ((last - first) / 1000)),
  node_cpu_s: +node.toFixed(3),
  redis_cpu_s: +redis.toFixed(2),
  cores: +((node + redis) / wall).toFixed(2),
  cpu_s_per_10k: +(((node + redis) / N) * 1e4).toFixed(3),
}));
await worker.close();
await queue.close();
await flush.quit();
