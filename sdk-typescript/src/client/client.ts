// The client a service uses to submit and manage activities: one connection,
// each call sent with the token and the call timeout, reads and submits
// retried on UNAVAILABLE, every failure a `SpoolError` carrying its gRPC code.
// Answers are the generated `spool.v1` messages; `execute` and `start` add
// typed inputs and outputs from an activity definition.
import type { CallOptions, ClientUnaryCall, Metadata, ServiceError } from "@grpc/grpc-js";
import { fromJsonPayload, type ActivityDefinition } from "../activity.js";
import { ActivityFailedError, SpoolError } from "../errors.js";
import {
  ActivityServiceClient,
  type ListResponse,
  type ServerInfo,
  type StatsResponse,
  type SubmitResponse,
} from "../gen/spool/v1/activity.js";
import { AdminServiceClient, type DrainResponse, type ListWorkersResponse } from "../gen/spool/v1/admin.js";
import { ActivityStatus, type Activity, type ActivityKey } from "../gen/spool/v1/common.js";
import { toDuration } from "../internal/duration.js";
import { dial, type ConnectionOptions, type Dial } from "../transport.js";
import { defaultRetry, retrying, type RetryOptions } from "./retry.js";
import { toSubmitRequest, type SubmitOptions, type SubmitSpec } from "./submit.js";

export interface ClientOptions extends ConnectionOptions {
  /** How UNAVAILABLE is retried for reads and submits (default: 5 tries, 100 ms to 2 s). */
  retry?: Partial<RetryOptions>;
  /** The longest one call may take, but a `wait` (default: the server's own limit). */
  timeoutMs?: number;
}

/** An activity's key; an empty or missing namespace is `default`. */
export interface KeyLike {
  namespace?: string;
  workflowId: string;
  activityId: string;
}

/** Which activities to list. */
export interface ListFilter {
  namespace?: string;
  status?: ActivityStatus;
  type?: string;
  /** Activities per page (the server caps it). */
  pageSize?: number;
  /** Continue after a page of an earlier listing. */
  pageToken?: string;
  /** Newest (last submitted) first; the default is oldest first. */
  newestFirst?: boolean;
}

type Callback<T> = (error: ServiceError | null, response?: T) => void;
type Invoke<T> = (metadata: Metadata, options: Partial<CallOptions>, callback: Callback<T>) => ClientUnaryCall;

const toKey = (k: KeyLike): ActivityKey => ({ namespace: k.namespace ?? "", workflowId: k.workflowId, activityId: k.activityId });

/** The output of a COMPLETED activity (JSON), or an `ActivityFailedError`. */
export function outputOf<O>(activity: Activity, check?: (json: unknown) => O): O {
  if (activity.status !== ActivityStatus.ACTIVITY_STATUS_COMPLETED) throw new ActivityFailedError(activity);
  const json = fromJsonPayload(activity.output);
  return check ? check(json) : (json as O);
}

/** A submitted activity, typed by its definition. */
export class ActivityHandle<O> {
  constructor(
    private readonly client: Client,
    readonly key: ActivityKey,
    /** False when the key already existed with the same type. */
    readonly created: boolean,
    private readonly check: ((json: unknown) => O) | undefined,
  ) {}

  /** The output once it finished; `ActivityFailedError` if it FAILED or was CANCELLED. */
  async result(): Promise<O> {
    return outputOf(await this.client.wait(this.key), this.check);
  }

  get(): Promise<Activity> {
    return this.client.get(this.key);
  }

  cancel(reason = ""): Promise<Activity> {
    return this.client.cancel(this.key, reason);
  }

  retry(): Promise<Activity> {
    return this.client.retry(this.key);
  }
}

export class Client {
  readonly #dial: Dial;
  readonly #activities: ActivityServiceClient;
  readonly #admin: AdminServiceClient;
  readonly #retry: RetryOptions;
  readonly #timeoutMs: number | undefined;

  constructor(options: ClientOptions) {
    this.#dial = dial(options);
    const { target, credentials, options: channel } = this.#dial;
    this.#activities = new ActivityServiceClient(target, credentials, channel);
    // The same channel for both services.
    this.#admin = new AdminServiceClient(target, credentials, { ...channel, channelOverride: this.#activities.getChannel() });
    this.#retry = { ...defaultRetry, ...options.retry };
    this.#timeoutMs = options.timeoutMs;
  }

  /** Closes the connection; calls after it fail. */
  close(): void {
    this.#activities.close();
  }

  #call<T>(invoke: Invoke<T>, timed = true): Promise<T> {
    const options: Partial<CallOptions> = timed && this.#timeoutMs !== undefined ? { deadline: Date.now() + this.#timeoutMs } : {};
    return new Promise((resolve, reject) => {
      invoke(this.#dial.metadata(), options, (error, response) => {
        if (error) reject(SpoolError.fromService(error));
        else resolve(response as T);
      });
    });
  }

  /** A call that may safely be sent again, retried on UNAVAILABLE. */
  #retried<T>(invoke: Invoke<T>, timed = true): Promise<T> {
    return retrying(this.#retry, () => this.#call(invoke, timed));
  }

  /** Stores one activity; `created` is false when its key already existed with
   * the same type (the stored activity is answered). The same key with another
   * type is `ALREADY_EXISTS`. */
  submit(spec: SubmitSpec): Promise<SubmitResponse> {
    const request = toSubmitRequest(spec);
    return this.#retried((m, o, cb) => this.#activities.submit(request, m, o, cb));
  }

  /** Stores activities all or nothing, in one commit; one answer per activity, in order. */
  async submitBatch(specs: SubmitSpec[]): Promise<SubmitResponse[]> {
    const request = { activities: specs.map(toSubmitRequest) };
    return (await this.#retried<{ results: SubmitResponse[] }>((m, o, cb) => this.#activities.submitBatch(request, m, o, cb))).results;
  }

  /** The activity now; with `history`, its ended attempts too. */
  get(key: KeyLike, options: { history?: boolean } = {}): Promise<Activity> {
    const request = { key: toKey(key), includeHistory: options.history ?? false };
    return this.#retried((m, o, cb) => this.#activities.get(request, m, o, cb));
  }

  /** The activity once it finished, or at `timeoutMs` as it is then. Without a
   * timeout it waits to the end, asking again each time the server answers at
   * its own longest wait. */
  async wait(key: KeyLike, options: { timeoutMs?: number } = {}): Promise<Activity> {
    const request = { key: toKey(key), timeout: toDuration(options.timeoutMs) };
    for (;;) {
      const activity = await this.#retried<Activity>((m, o, cb) => this.#activities.wait(request, m, o, cb), false);
      if (options.timeoutMs !== undefined || activity.status >= ActivityStatus.ACTIVITY_STATUS_COMPLETED) return activity;
    }
  }

  /** Ends a SCHEDULED or RUNNING activity; its worker is told why. Sent once. */
  cancel(key: KeyLike, reason = ""): Promise<Activity> {
    const request = { key: toKey(key), reason };
    return this.#call((m, o, cb) => this.#activities.cancel(request, m, o, cb));
  }

  /** Runs a FAILED or CANCELLED activity again with a fresh attempt budget. Sent once. */
  retry(key: KeyLike): Promise<Activity> {
    const request = { key: toKey(key) };
    return this.#call((m, o, cb) => this.#activities.retry(request, m, o, cb));
  }

  /** The pages of activities matching `filter`, fetched as they are read:
   * `for await (const page of client.list({...}))`. */
  async *list(filter: ListFilter = {}): AsyncGenerator<ListResponse, void, undefined> {
    let pageToken = filter.pageToken ?? "";
    do {
      const request = {
        namespace: filter.namespace ?? "",
        status: filter.status ?? ActivityStatus.ACTIVITY_STATUS_UNSPECIFIED,
        activityType: filter.type ?? "",
        pageSize: filter.pageSize ?? 0,
        pageToken,
        newestFirst: filter.newestFirst ?? false,
      };
      const page: ListResponse = await this.#retried((m, o, cb) => this.#activities.list(request, m, o, cb));
      yield page;
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /** Activities by status in a namespace, the workers connected, whether the node drains. */
  stats(namespace = ""): Promise<StatsResponse> {
    return this.#retried((m, o, cb) => this.#activities.stats({ namespace }, m, o, cb));
  }

  /** The server's version, protocol versions and limits. */
  serverInfo(): Promise<ServerInfo> {
    return this.#retried((m, o, cb) => this.#activities.getServerInfo({}, m, o, cb));
  }

  /** Submits a typed activity and returns its handle. */
  async start<I, O>(activity: ActivityDefinition<I, O>, input: I, options: SubmitOptions = {}): Promise<ActivityHandle<O>> {
    const { activity: stored, created } = await this.submit({ ...options, type: activity.name, input });
    return new ActivityHandle(this, stored!.key!, created, activity.output);
  }

  /** Submits a typed activity and waits for its output (idempotent by key). */
  async execute<I, O>(activity: ActivityDefinition<I, O>, input: I, options: SubmitOptions = {}): Promise<O> {
    return (await this.start(activity, input, options)).result();
  }

  /** Drains this node (admin): no more dispatch; what runs may finish for `timeoutMs`. */
  drain(timeoutMs?: number): Promise<DrainResponse> {
    return this.#call((m, o, cb) => this.#admin.drain({ timeout: toDuration(timeoutMs) }, m, o, cb), false);
  }

  /** Ends a drain of this node (admin). */
  async resume(): Promise<boolean> {
    return (await this.#call<{ wasDraining: boolean }>((m, o, cb) => this.#admin.resume({}, m, o, cb))).wasDraining;
  }

  /** The workers connected to this node. */
  workers(namespace = ""): Promise<ListWorkersResponse> {
    return this.#retried((m, o, cb) => this.#admin.listWorkers({ namespace }, m, o, cb));
  }
}
