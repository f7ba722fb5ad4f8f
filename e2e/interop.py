"""Spool from another gRPC implementation: Python stubs generated from proto/.

Usage: interop.py --proto DIR --endpoint HOST:PORT --out DIR

Generates the spool.v1 stubs with grpcio-tools into --out, then plays a client
and a worker against a running server. Exits non-zero on the first mismatch.
"""

import argparse
import json
import os
import queue
import sys
import threading
import time


def generate(proto_dir, out_dir):
    from grpc_tools import protoc
    import grpc_tools

    os.makedirs(out_dir, exist_ok=True)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    files = [os.path.join("spool", "v1", f) for f in sorted(os.listdir(os.path.join(proto_dir, "spool", "v1")))]
    code = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *files])
    if code != 0:
        sys.exit(f"protoc failed with {code}")
    sys.path.insert(0, out_dir)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--proto", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    generate(args.proto, args.out)

    import grpc
    from google.protobuf import duration_pb2
    from spool.v1 import activity_pb2 as act, activity_pb2_grpc as act_grpc
    from spool.v1 import admin_pb2 as adm, admin_pb2_grpc as adm_grpc
    from spool.v1 import common_pb2 as common, worker_pb2 as wrk, worker_pb2_grpc as wrk_grpc

    options = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    channel = grpc.insecure_channel(args.endpoint, options=options)
    grpc.channel_ready_future(channel).result(timeout=10)
    client = act_grpc.ActivityServiceStub(channel)
    admin = adm_grpc.AdminServiceStub(channel)

    def key(wf, a):
        return common.ActivityKey(workflow_id=wf, activity_id=a)

    def payload(value):
        return common.Payload(content_type="application/json", data=json.dumps(value).encode())

    def code_of(call):
        try:
            call()
        except grpc.RpcError as e:
            return e.code()
        return grpc.StatusCode.OK

    fast = common.RetryPolicy(max_attempts=3, initial_interval=duration_pb2.Duration(nanos=10_000_000), backoff_coefficient=1.0)

    # What the server is and accepts.
    info = client.GetServerInfo(act.GetServerInfoRequest())
    check(info.version and list(info.protocol_versions) == [1] and info.max_payload_bytes > 0 and info.max_batch_size > 0, f"server info: {info}")

    # Submit before any worker: it waits, attempt 0. Headers travel with it.
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = {"traceparent": traceparent, "tenant": "py"}
    r = client.Submit(act.SubmitRequest(activity_type="py.echo", workflow_id="py", activity_id="a1", input=payload({"n": 1}), headers=headers))
    check(dict(r.activity.headers) == headers, f"headers stored: {r.activity.headers}")
    check(r.created and r.activity.status == common.ACTIVITY_STATUS_SCHEDULED and r.activity.attempt == 0, f"submit: {r}")
    again = client.Submit(act.SubmitRequest(activity_type="py.echo", workflow_id="py", activity_id="a1"))
    check(not again.created, "idempotent submit")
    check(code_of(lambda: client.Submit(act.SubmitRequest(activity_type="other", workflow_id="py", activity_id="a1"))) == grpc.StatusCode.ALREADY_EXISTS, "conflict")

    # A worker on a bidirectional stream, written against the generated stubs.
    outbox = queue.Queue()

    def requests():
        while True:
            m = outbox.get()
            if m is None:
                return
            yield m

    worker = wrk_grpc.WorkerServiceStub(channel)
    outbox.put(wrk.WorkerMessage(hello=wrk.Hello(identity="python", activity_types=["py.echo", "py.fail"], max_concurrency=2)))
    stream = worker.Session(requests())
    first = next(stream)
    check(first.WhichOneof("message") == "welcome" and first.welcome.worker_id, f"welcome: {first}")
    check(first.welcome.max_payload_bytes == info.max_payload_bytes, f"welcome limits: {first}")
    tasks = []
    inbox = queue.Queue()

    def read():
        try:
            for m in stream:
                inbox.put(m)
        except grpc.RpcError:
            pass
        inbox.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen_acks = []

    def serve_until(done, budget=10.0):
        deadline = time.time() + budget
        while not done():
            m = inbox.get(timeout=max(0.01, deadline - time.time()))
            check(m is not None, "stream ended early")
            kind = m.WhichOneof("message")
            if kind == "ack":
                seen_acks.append(m.ack)
            elif kind == "task":
                t = m.task
                tasks.append(t)
                res = wrk.ActivityResult(workflow_id=t.workflow_id, activity_id=t.activity_id, attempt=t.attempt)
                if t.activity_type == "py.echo":
                    res.output.CopyFrom(payload({"echo": json.loads(t.input.data or b"null"), "attempt": t.attempt}))
                else:
                    # Progress first: the next attempt is handed the last details.
                    beat = wrk.Heartbeat(workflow_id=t.workflow_id, activity_id=t.activity_id, attempt=t.attempt, details=payload({"progress": t.attempt}))
                    outbox.put(wrk.WorkerMessage(heartbeat=beat))
                    res.error.CopyFrom(common.ActivityError(kind=common.ERROR_KIND_RETRYABLE, type="PyError", message=f"attempt {t.attempt}"))
                outbox.put(wrk.WorkerMessage(result=res))
            check(time.time() < deadline, "timed out")

    serve_until(lambda: any(a.activity_id == "a1" for a in seen_acks))
    check(seen_acks[-1].accepted, "ack accepted")
    got = client.Get(act.GetRequest(key=key("py", "a1")))
    check(got.status == common.ACTIVITY_STATUS_COMPLETED and json.loads(got.output.data) == {"echo": {"n": 1}, "attempt": 1}, f"completed: {got}")
    a1 = [t for t in tasks if t.activity_id == "a1"][0]
    check(dict(a1.headers) == headers and a1.max_attempts == 10 and a1.counted_attempts == 0 and not a1.HasField("last_heartbeat_details"), f"task fields: {a1}")

    # Retries then the dead letter.
    client.Submit(act.SubmitRequest(activity_type="py.fail", workflow_id="py", activity_id="f1", retry_policy=fast))
    serve_until(lambda: sum(1 for a in seen_acks if a.activity_id == "f1") == 3)
    failed = client.Wait(act.WaitRequest(key=key("py", "f1"), timeout=duration_pb2.Duration(seconds=5)))
    check(failed.status == common.ACTIVITY_STATUS_FAILED and failed.attempt == 3 and failed.last_error.type == "PyError", f"dead letter: {failed}")
    f1 = [t for t in tasks if t.activity_id == "f1"]
    check([t.counted_attempts for t in f1] == [0, 1, 2] and all(t.max_attempts == 3 for t in f1), f"budget: {f1}")
    check([json.loads(t.last_heartbeat_details.data) if t.HasField("last_heartbeat_details") else None for t in f1] == [None, {"progress": 1}, {"progress": 2}], f"resume from the last details: {f1}")

    # A stale attempt is refused.
    outbox.put(wrk.WorkerMessage(result=wrk.ActivityResult(workflow_id="py", activity_id="a1", attempt=9, output=payload(0))))
    serve_until(lambda: any(a.activity_id == "a1" and a.attempt == 9 for a in seen_acks))
    check(not [a for a in seen_acks if a.attempt == 9][0].accepted, "stale result refused")

    # Re-drive, cancel, list, stats, workers.
    client.Retry(act.RetryRequest(key=key("py", "f1")))
    serve_until(lambda: sum(1 for a in seen_acks if a.activity_id == "f1") == 6)
    check(client.Get(act.GetRequest(key=key("py", "f1"))).attempt == 6, "re-drive ran three more attempts")
    client.Submit(act.SubmitRequest(activity_type="py.unserved", workflow_id="py", activity_id="c1"))
    cancelled = client.Cancel(act.CancelRequest(key=key("py", "c1"), reason="py"))
    check(wrk.CANCEL_KIND_REQUESTED == 1, "cancel kinds are generated")
    check(cancelled.status == common.ACTIVITY_STATUS_CANCELLED, "cancel")
    check(code_of(lambda: client.Cancel(act.CancelRequest(key=key("py", "c1")))) == grpc.StatusCode.FAILED_PRECONDITION, "cancel twice")
    batch = act.SubmitBatchRequest(activities=[act.SubmitRequest(activity_type="py.unserved", workflow_id="pyb", activity_id=f"b{i}") for i in range(5)])
    check(len(client.SubmitBatch(batch).results) == 5, "batch")
    ids, token = [], ""
    while True:
        page = client.List(act.ListRequest(page_size=2, page_token=token))
        ids += [a.key.activity_id for a in page.activities]
        token = page.next_page_token
        if not token:
            break
    check(ids == ["a1", "f1", "c1", "b0", "b1", "b2", "b3", "b4"], f"list: {ids}")
    stats = client.Stats(act.StatsRequest())
    check((stats.scheduled, stats.completed, stats.failed, stats.cancelled, stats.connected_workers) == (5, 1, 1, 1, 1), f"stats: {stats}")
    workers = admin.ListWorkers(adm.ListWorkersRequest()).workers
    check(len(workers) == 1 and workers[0].identity == "python", f"workers: {workers}")

    # Bad input.
    check(code_of(lambda: client.Submit(act.SubmitRequest(activity_type=""))) == grpc.StatusCode.INVALID_ARGUMENT, "empty type")
    check(code_of(lambda: client.Submit(act.SubmitRequest(activity_type="t", namespace="bad ns"))) == grpc.StatusCode.INVALID_ARGUMENT, "namespace")
    check(code_of(lambda: client.Submit(act.SubmitRequest(activity_type="t", delay=duration_pb2.Duration(seconds=-1)))) == grpc.StatusCode.INVALID_ARGUMENT, "negative delay")
    check(code_of(lambda: client.Submit(act.SubmitRequest(activity_type="t", retry_policy=common.RetryPolicy(max_attempts=10001)))) == grpc.StatusCode.INVALID_ARGUMENT, "max_attempts")
    big = common.Payload(data=b"x" * (5 * 1024 * 1024))
    check(code_of(lambda: client.Submit(act.SubmitRequest(activity_type="t", input=big))) == grpc.StatusCode.RESOURCE_EXHAUSTED, "5 MiB payload")
    check(code_of(lambda: client.Get(act.GetRequest(key=key("py", "missing")))) == grpc.StatusCode.NOT_FOUND, "not found")

    # Health and reflection are served too.
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    health = health_pb2_grpc.HealthStub(channel)
    check(health.Check(health_pb2.HealthCheckRequest(service="spool.v1.ActivityService")).status == health_pb2.HealthCheckResponse.SERVING, "health")

    outbox.put(None)
    print("python interop: ok")


if __name__ == "__main__":
    main()
