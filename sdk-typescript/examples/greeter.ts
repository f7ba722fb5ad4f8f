// The quick start's worker in TypeScript: serves `greet` ({"name": "Ada"} →
// "Hello, Ada!") at SPOOL_ADDRESS (default 127.0.0.1:7070), logging its
// connection, drains, reconnects and stop. Deploy-safe: SIGTERM or Ctrl-C says
// Goodbye, finishes what runs, reports it, and exits.
//
//   npm run example          # with `spool serve` running
//   spool submit greet --input '{"name":"Ada"}' --wait
import { ActivityError, consoleLogger, defineActivity, Worker } from "../src/index.js";

/** The contract, shared with the services that submit it. */
export const Greet = defineActivity<{ name: string }, string>("greet", {
  input: (json) => {
    const name = (json as { name?: unknown } | null)?.name;
    if (typeof name !== "string") throw new TypeError('expected {"name": "<a string>"}');
    return { name };
  },
});

const worker = new Worker({
  address: process.env.SPOOL_ADDRESS ?? "127.0.0.1:7070",
  token: process.env.SPOOL_TOKEN,
  maxConcurrency: 16,
  logger: consoleLogger,
});

worker.register(Greet, async (ctx, { name }) => {
  if (name.trim() === "") throw ActivityError.terminal("NoName", "a greeting needs a name");
  ctx.heartbeat({ greeting: name });
  return `Hello, ${name}!`;
});

await worker.runUntilSignal();
