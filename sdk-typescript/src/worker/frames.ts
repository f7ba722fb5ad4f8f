// How messages become frames on the worker stream, both ways. Today each
// message is one frame: the protocol has no batched frames yet. Another issue
// adds them (a server offering them in its Welcome); the session sends only
// through an `Outbound` and reads only through `messagesOf`, so batching is a
// new `Outbound` (gathering what is sent in one turn of the event loop into one
// frame) and a new unpacking, chosen here from the Welcome, and nothing else in
// the worker changes.
import type { ClientDuplexStream } from "@grpc/grpc-js";
import type { ServerMessage, Welcome, WorkerMessage } from "../gen/spool/v1/worker.js";

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

  constructor(private readonly stream: SessionStream) {}

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

/** The outbound framing for a stream the server welcomed with `welcome`. */
export function outboundFor(stream: SessionStream, _welcome: Welcome): Outbound {
  return new Unbatched(stream);
}

/** The messages of one inbound frame, in order. */
export function messagesOf(frame: ServerMessage): ServerMessage[] {
  return [frame];
}
