"""Client side of the site's local AgentWorker gRPC API (``protos/hacrl_fed/v1/worker.proto``).

Used by the per-message ClientApp (a courier: one call, then the process exits) and by
``hacrl-fed client`` to wait until the worker is healthy. Loopback or unix-socket addresses only
carry plaintext gRPC, so no TLS here; every call carries the site's worker token
(:mod:`hacrl_fed.protocol.worker_token`), without which the worker answers ``UNAUTHENTICATED``.
Imports only grpc, the generated stubs and the token file reader: no torch.
"""

from __future__ import annotations

import time

import grpc

from hacrl_fed.protocol.worker_token import TOKEN_METADATA
from hacrl_fed.v1 import rollout_pb2 as rpb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.v1.worker_pb2_grpc import AgentWorkerStub

__all__ = ["WorkerError", "WorkerLink", "WorkerUnavailableError", "wait_until_healthy"]

_MAX_MESSAGE_BYTES = 1 << 30
"""gRPC message cap on the loopback link: a train request carries every agent's envelope."""
_UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class WorkerError(RuntimeError):
    """The worker answered with an error status. ``code`` is the gRPC status name."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class WorkerUnavailableError(WorkerError):
    """The worker could not be reached or did not answer in time."""


class WorkerLink:
    """A channel to one worker; every call carries ``token``. Use as a context manager or call :meth:`close`."""

    def __init__(self, address: str, *, token: str) -> None:
        if not address:
            raise WorkerUnavailableError("no worker address configured (node_config worker-address)")
        if not token:
            raise WorkerError("no worker token (node_config worker-token-file names the site's token file)")
        self.address = address
        self._metadata = ((TOKEN_METADATA, token),)
        self._channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ])
        self._stub = AgentWorkerStub(self._channel)

    def _call(self, name: str, request, timeout_s: float):
        try:
            return getattr(self._stub, name)(request, timeout=max(0.1, timeout_s), metadata=self._metadata)
        except grpc.RpcError as err:
            code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
            text = f"worker {self.address} {name}: {code.name}: {err.details() if hasattr(err, 'details') else err}"
            cls = WorkerUnavailableError if code in _UNAVAILABLE else WorkerError
            raise cls(text, code.name) from None

    def generate(self, plan: rpb.RoundPlan, timeout_s: float, notice: str = "") -> wpb.GenerateResponse:
        """Generate, score and sign the step's rollouts (``notice``: what the coordinator tells the site).
        Raises WorkerError / WorkerUnavailableError."""
        return self._call("Generate", wpb.GenerateRequest(plan=plan, notice=notice), timeout_s)

    def train(self, request: wpb.TrainRequest, timeout_s: float) -> rpb.TrainReport:
        """Verify the pool and run the HACPO update. Raises WorkerError / WorkerUnavailableError."""
        return self._call("Train", request, timeout_s)

    def evaluate(self, request: wpb.EvaluateRequest, timeout_s: float) -> wpb.EvaluateResponse:
        return self._call("Evaluate", request, timeout_s)

    def checkpoint(self, timeout_s: float, path: str = "") -> wpb.CheckpointResponse:
        """Save a resumable checkpoint (into the worker's directory unless ``path``, which must lie in the site's
        directory)."""
        return self._call("Checkpoint", wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE, path=path), timeout_s)

    def export(self, timeout_s: float, path: str = "") -> wpb.CheckpointResponse:
        """Export the model as a plain Hugging Face directory (``path`` must lie in the site's directory)."""
        return self._call("Checkpoint", wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT, path=path), timeout_s)

    def health(self, timeout_s: float = 5.0) -> wpb.HealthResponse:
        return self._call("Health", wpb.HealthRequest(), timeout_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> WorkerLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until_healthy(address: str, timeout_s: float, *, token: str, poll_s: float = 0.5,
                       alive=lambda: True) -> wpb.HealthResponse:
    """Poll Health (carrying ``token``) until the worker reports ``ready``.

    ``alive()`` is checked between polls (e.g. "the worker process still runs"); when it turns
    false the wait ends early. Raises WorkerUnavailableError on timeout or when ``alive()`` fails,
    WorkerError if the worker answers with an error status.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    with WorkerLink(address, token=token) as link:
        while time.monotonic() < deadline:
            if not alive():
                raise WorkerUnavailableError(f"worker {address} exited before it became healthy ({last})")
            try:
                health = link.health(timeout_s=min(5.0, max(0.1, deadline - time.monotonic())))
                if health.ready:
                    return health
                last = "not ready"
            except WorkerUnavailableError as err:
                last = str(err)
            time.sleep(poll_s)
    raise WorkerUnavailableError(f"worker {address} not healthy after {timeout_s:g} s ({last})")
