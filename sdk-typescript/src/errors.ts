// The errors a caller branches on: a server's answer kept whole with its gRPC
// code (`SpoolError`), an activity that ended without completing
// (`ActivityFailedError`), and why a worker stopped (`WorkerError`).
import { status as Status, type ServiceError } from "@grpc/grpc-js";
import { ActivityStatus, type Activity } from "./gen/spool/v1/common.js";

/** The name of a gRPC status code, as the server's docs spell it (`NOT_FOUND`). */
export function codeName(code: Status): string {
  return Status[code] ?? `CODE_${code}`;
}

/**
 * A call the server (or the way to it) refused: `code` is the gRPC status code
 * (`status.NOT_FOUND`, `status.ALREADY_EXISTS`, …; `UNAVAILABLE` when no server
 * answers), `codeName` its name, `details` the server's message.
 */
export class SpoolError extends Error {
  override readonly name = "SpoolError";
  readonly code: Status;
  readonly codeName: string;
  readonly details: string;

  constructor(code: Status, details: string, options?: { cause?: unknown }) {
    super(`${codeName(code)}: ${details}`, options);
    this.code = code;
    this.codeName = codeName(code);
    this.details = details;
  }

  static fromService(e: ServiceError): SpoolError {
    return new SpoolError(e.code, e.details || e.message, { cause: e });
  }
}

function statusName(s: ActivityStatus): string {
  return (ActivityStatus[s] ?? "UNKNOWN").replace("ACTIVITY_STATUS_", "");
}

/** The activity finished FAILED (its `lastError` says why) or CANCELLED. */
export class ActivityFailedError extends Error {
  override readonly name = "ActivityFailedError";
  readonly activity: Activity;

  constructor(activity: Activity) {
    const key = activity.key;
    const error = activity.lastError;
    super(
      `${key?.namespace}/${key?.workflowId}/${key?.activityId} ended ${statusName(activity.status)}: ${
        error ? `${error.type}: ${error.message}` : "no error recorded"
      }`,
    );
    this.activity = activity;
  }
}

/** Why a worker stopped: retrying cannot help until its configuration changes. */
export class WorkerError extends Error {
  override readonly name = "WorkerError";
  /** `NoHandlers`, `InvalidEndpoint`, `Rejected` (the server refused the session) or `Protocol`. */
  readonly kind: "NoHandlers" | "InvalidEndpoint" | "Rejected" | "Protocol";
  /** For `Rejected`: the gRPC status code. */
  readonly code?: Status;

  constructor(kind: WorkerError["kind"], message: string, code?: Status) {
    super(message);
    this.kind = kind;
    if (code !== undefined) this.code = code;
  }
}
