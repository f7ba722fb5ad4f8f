// How messages become frames on the worker stream, both ways. A worker asks for
// batches in its Hello; the server may then send several tasks (or acks) in one
// frame, and, when its Welcome says it reads them, the results a turn of the event
// loop finishes go out as one frame. The session sends only through an `Outbound`
// and reads only through `messagesOf`, so nothing else in the worker knows.
import type { ClientDuplexStream } from "@grpc/grpc-js";
import type { ActivityResult, ServerMessage, Welcome, WorkerMessage } from "../gen/spool/v1/worker.js";

export type SessionStream = ClientDuplexStream<WorkerMessage, ServerMessage>;

/** The sending side of one stream. */
export interface Outbound {
  send(message: WorkerMessage): void;
  /** Half-closes: nothing more is sent, and the server's side is read to its end. */
  end(): void;
  readonly open: boolean;
}

/** One message per frame. */
class Unbatched implements Outbound {
  #open = true;

  constructor(protected readonly stream: SessionStream) {}

  get open(): boolean {
    return this.#open && !this.stream.writableEnded && !this.stream.destroyed;
  }

  send(message: WorkerMessage): void {
    // Writes after the call ended would be errors on the stream; what was not
    // acknowledged is sent again on the next stream anyway.
    if (this.open) this.stream.write(message);
  }

  end(): void {
    if (this.open) this.stream.end();
    this.#open = false;
  }
}

/**
 * The most results one frame carries, and the bytes past which it takes no more:
 * far below the server's message limit (16 MiB at the least), which one frame
 * of many large outputs would pass.
 */
const BATCH_MAX = 256;
const BATCH_BYTES = 1024 * 1024;

/** About the bytes `result` takes on the wire (at most, for its texts). */
function roughSize(result: ActivityResult): number {
  const outcome = result.outcome;
  const ids = 3 * (result.workflowId.length + result.activityId.length) + 16;
  switch (outcome?.$case) {
    case "output":
      return ids + outcome.value.data.length;
    case "error":
      return ids + 3 * (outcome.value.type.length + outcome.value.message.length) + (outcome.value.details?.data.length ?? 0);
    default:
      return ids;
  }
}

/**
 * Results sent in one turn of the event loop leave as one frame; anything else
 * sent meanwhile goes after them, so the order is kept.
 */
class Batched extends Unbatched {
  #results: ActivityResult[] = [];
  #bytes = 0;
  #scheduled = false;

  override send(message: WorkerMessage): void {
    if (message.message?.$case === "result") {
      this.#results.push(message.message.value);
      this.#bytes += roughSize(message.message.value);
      if (this.#results.length >= BATCH_MAX || this.#bytes >= BATCH_BYTES) return this.#flush();
      if (!this.#scheduled) {
        this.#scheduled = true;
        setImmediate(() => this.#flush());
      }
      return;
    }
    this.#flush();
    super.send(message);
  }

  override end(): void {
    this.#flush();
    super.end();
  }

  #flush(): void {
    this.#scheduled = false;
    const results = this.#results;
    if (results.length === 0) return;
    this.#results = [];
    this.#bytes = 0;
    if (results.length === 1) {
      super.send({ message: { $case: "result", value: results[0]! } });
    } else {
      super.send({ message: { $case: "results", value: { results } } });
    }
  }
}

/** The outbound framing for a stream the server welcomed with `welcome`. */
export function outboundFor(stream: SessionStream, welcome: Welcome): Outbound {
  return welcome.batches ? new Batched(stream) : new Unbatched(stream);
}

/** The messages of one inbound frame, in order. */
export function messagesOf(frame: ServerMessage): ServerMessage[] {
  const m = frame.message;
  switch (m?.$case) {
    case "tasks":
      return m.value.tasks.map((task) => ({ message: { $case: "task", value: task } }));
    case "acks":
      return m.value.acks.map((ack) => ({ message: { $case: "ack", value: ack } }));
    default:
      return [frame];
  }
}
