"""A purpose-built AgentWorker for tests: the attacker (hostile envelopes in turn) or a model-free honest site.

In process: ``FakeWorker(...)`` + :func:`serve`. As a process (the malicious client of the end-to-end
test)::

    python tests/helpers/fake_worker.py --name mallory --key mallory.ed25519.key --stranger-key eve.ed25519.key \
        --cases tampered,replay --max-bytes 65536 --address-file addr --log calls.jsonl \
        --token-file sites/mallory/worker.token

Every request is appended to ``--log`` as one JSON line (``{"rpc": ..., "step": ...}``), so a test can
check that the attacker was never sent the pool.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).parent))

from hostile import HOSTILE, Keys, envelope_bytes, honest_batch  # noqa: E402

from hacrl_fed.protocol.keys import load_signing_key  # noqa: E402
from hacrl_fed.protocol.worker_token import ensure_token  # noqa: E402
from hacrl_fed.v1 import rollout_pb2 as pb  # noqa: E402
from hacrl_fed.v1 import worker_pb2 as wpb  # noqa: E402
from hacrl_fed.v1 import worker_pb2_grpc as wgrpc  # noqa: E402


class FakeWorker(wgrpc.AgentWorkerServicer):
    """Honest (``cases`` empty) or hostile (delivers ``cases[(step - 1) % len(cases)]``)."""

    def __init__(self, name: str, keys: Keys, *, cases: tuple[str, ...] = (), max_bytes: int = 64 * 1024,
                 log_path: str | None = None, fail: str = "") -> None:
        self.name, self.keys, self.cases, self.max_bytes = name, keys, cases, max_bytes
        self.log_path = log_path
        self.fail = fail
        """RPC name that answers INTERNAL (to test error replies)."""
        self.calls: list[dict] = []
        self.requests: list = []
        """Every request as received (notices, deadlines …)."""
        self.step = 0
        self._lock = threading.Lock()

    def _record(self, rpc: str, **info) -> None:
        entry = {"rpc": rpc, **info}
        with self._lock:
            self.calls.append(entry)
            if self.log_path:
                with open(self.log_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(entry) + "\n")

    def Generate(self, request, context):
        plan = request.plan
        self.requests.append(request)
        self._record("Generate", step=plan.step, **({"notice": request.notice} if request.notice else {}))
        if self.fail == "Generate":
            context.abort(grpc.StatusCode.INTERNAL, "RuntimeError: generation exploded")
        if self.cases:
            build, reason = HOSTILE[self.cases[(plan.step - 1) % len(self.cases)]]
            raw = build(plan, self.name, self.keys, self.max_bytes)
            try:
                env = pb.SignedEnvelope.FromString(raw)
            except Exception:  # noqa: BLE001 - garbage bytes cannot ride in a typed field; send them raw
                env = pb.SignedEnvelope(payload=raw, key_id=self.name)
        else:
            env = pb.SignedEnvelope.FromString(envelope_bytes(honest_batch(plan, self.name), self.keys.own))
        return wpb.GenerateResponse(envelope=env, metrics={"time/generate_s": 0.001})

    def Train(self, request, context):
        self.requests.append(request)
        self._record("Train", step=request.step, pool=sorted(e.key_id for e in request.envelopes),
                     corrections=len(request.capabilities.corrections))
        if self.fail == "Train":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no own rollouts for this step")
        self.step = request.step
        return pb.TrainReport(run_id=request.run_id, step=request.step, agent_id=self.name,
                              metrics={"loss": 0.0, "time/total_s": 0.001})

    def Evaluate(self, request, context):
        self._record("Evaluate", prompts=len(request.prompts))
        return wpb.EvaluateResponse(metrics={"avg@1": 0.0, "problems": float(len(request.prompts))})

    def Health(self, request, context):
        return wpb.HealthResponse(agent_id=self.name, ready=True, step=self.step, device="cpu")

    def Checkpoint(self, request, context):
        self._record("Checkpoint", kind=int(request.kind))
        if self.fail == "Checkpoint":
            context.abort(grpc.StatusCode.INTERNAL, "OSError: [Errno 28] No space left on device")
        return wpb.CheckpointResponse(path="/dev/null", step=self.step)


def serve(worker: FakeWorker, address: str = "127.0.0.1:0", *, token: str | None = None) -> tuple[grpc.Server, str]:
    """Serve ``worker``; with ``token`` every call must carry it (the real worker's check)."""
    from hacrl_fed.worker.service import TokenCheck

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), interceptors=[TokenCheck(token)] if token else [],
                         options=[("grpc.max_receive_message_length", 1 << 28)])
    wgrpc.add_AgentWorkerServicer_to_server(worker, server)
    port = server.add_insecure_port(address)
    server.start()
    return server, f"{address.rpartition(':')[0]}:{port}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--stranger-key", required=True)
    ap.add_argument("--cases", default="")
    ap.add_argument("--max-bytes", type=int, default=64 * 1024)
    ap.add_argument("--address-file", required=True)
    ap.add_argument("--log")
    ap.add_argument("--token-file", help="the site's worker token file (read, or written when missing)")
    args = ap.parse_args()
    keys = Keys(own=load_signing_key(args.key), stranger=load_signing_key(args.stranger_key))
    cases = tuple(c for c in args.cases.split(",") if c)
    token = ensure_token(args.token_file) if args.token_file else None
    server, address = serve(FakeWorker(args.name, keys, cases=cases, max_bytes=args.max_bytes, log_path=args.log),
                            token=token)
    Path(args.address_file).write_text(address + "\n")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=1).wait()


if __name__ == "__main__":
    main()
