// @spool/sdk: Spool workers and clients for Node.js. The public surface; each
// module's header says what it owns.
export { defineActivity, toJsonPayload, fromJsonPayload, EncodeError, DecodeError } from "./activity.js";
export type { ActivityDefinition, InputOf, OutputOf } from "./activity.js";
export { SpoolError, ActivityFailedError, WorkerError, codeName } from "./errors.js";
export { InvalidEndpointError } from "./transport.js";
export type { ConnectionOptions, TlsOptions } from "./transport.js";
export { consoleLogger, quietLogger, silentLogger } from "./internal/log.js";
export type { Logger, LogFields } from "./internal/log.js";

export { Worker } from "./worker/worker.js";
export type { WorkerOptions, Handler, Ack } from "./worker/worker.js";
export { ActivityError } from "./worker/activity-error.js";
export type { ActivityErrorKind } from "./worker/activity-error.js";
export { ActivityContext, CancelledError } from "./worker/context.js";
export type { ActivityInfo, CancelReasonKind } from "./worker/context.js";
export type { ConnectionState } from "./worker/session.js";

export { Client, ActivityHandle, outputOf } from "./client/client.js";
export type { ClientOptions, KeyLike, ListFilter } from "./client/client.js";
export type { RetryOptions } from "./client/retry.js";
export type { SubmitOptions, SubmitSpec, RetryPolicy } from "./client/submit.js";

// The wire's messages, for callers that read activities whole.
export { ActivityStatus, ErrorKind } from "./gen/spool/v1/common.js";
export type { Activity, ActivityKey, Payload, AttemptRecord } from "./gen/spool/v1/common.js";
export type { ListResponse, ServerInfo, StatsResponse, SubmitResponse } from "./gen/spool/v1/activity.js";
export type { DrainResponse, ListWorkersResponse, WorkerInfo } from "./gen/spool/v1/admin.js";
export { status } from "@grpc/grpc-js";
