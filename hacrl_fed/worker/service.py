"""gRPC face of the agent worker (``protos/hacrl_fed/v1/worker.proto``), loopback or unix socket only.

Every call must carry the site's worker token (:mod:`hacrl_fed.protocol.worker_token`) as the gRPC metadata
``x-hacrl-worker-token``: a server interceptor compares it (``hmac.compare_digest``) before any request is
parsed, and a call without it, or with another one, is refused ``UNAUTHENTICATED`` (logged, the server keeps
running). :func:`connect` makes a channel that sends it.

The servicer is a shim (style anchor "FedRAG's client handler"): decode, call
:class:`~hacrl_fed.worker.agent.AgentWorker`, encode. Errors become status codes with readable
messages and the server keeps running:

* :class:`~hacrl_fed.worker.errors.InvalidRequestError` → ``INVALID_ARGUMENT`` (bad plan, prompts, sampling)
* :class:`~hacrl_fed.worker.errors.PreconditionError` → ``FAILED_PRECONDITION`` (wrong run, no rollouts)
* anything else → ``INTERNAL`` with ``Type: message`` (the traceback goes to the worker's log)

:func:`run_worker` is the body of the internal ``hacrl-fed worker`` command.
"""

from __future__ import annotations

import collections
import hmac
import logging
import signal
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from hacrl_fed.atomic import atomic_write_text
from hacrl_fed.protocol.worker_token import TOKEN_FILE, TOKEN_METADATA, ensure_token
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.v1 import worker_pb2_grpc as wgrpc
from hacrl_fed.worker.errors import InvalidRequestError, PreconditionError

__all__ = ["GRPC_OPTIONS", "AgentWorkerServicer", "TokenCheck", "check_bind_address", "connect", "run_worker",
           "serve", "wait_healthy"]

log = logging.getLogger("hacrl_fed.worker")
detail_log = logging.getLogger("hacrl_fed.worker.detail")

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
"""Channel/server options: pooled rollout batches of many agents can be tens of MiB."""
_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


def check_bind_address(address: str) -> str:
    """Return ``address`` if it is ``unix:/path`` or a loopback ``host:port``; raise ``ValueError`` otherwise.

    The worker's API is for the site's own processes (and needs the site's token), so it must never listen on
    a routable interface (ARCHITECTURE §1, §6).
    """
    if address.startswith("unix:"):
        if len(address) <= len("unix:") or address.startswith("unix-abstract:"):
            raise ValueError(f"bad unix socket address {address!r}; use unix:/path/to/socket")
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"bad worker address {address!r}; use 127.0.0.1:PORT (0 = any free port) or unix:/path")
    if host not in _LOOPBACK_HOSTS:
        raise ValueError(f"refusing to bind the worker to {host!r}: only loopback (127.0.0.1, ::1, localhost) "
                         "or a unix socket is allowed: the worker's API is for this machine's site processes only")
    return address


class TokenCheck(grpc.ServerInterceptor):
    """Let a call through only when its :data:`TOKEN_METADATA` equals the site's token; refuse it otherwise
    (``UNAUTHENTICATED``, before its request is parsed), with a warning line (at most one per
    :attr:`LOG_EVERY_S` seconds, counting the ones left out)."""

    LOG_EVERY_S = 10.0

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("the worker needs a token (hacrl_fed.protocol.worker_token)")
        self._token = token.encode("utf-8")
        self._lock = threading.Lock()
        self._last_log = -float("inf")
        self._unlogged = 0

    def intercept_service(self, continuation, handler_call_details):
        sent = [v for k, v in handler_call_details.invocation_metadata or () if k == TOKEN_METADATA]
        value = sent[0] if len(sent) == 1 else None
        if isinstance(value, str | bytes) and hmac.compare_digest(
                value.encode("utf-8", "replace") if isinstance(value, str) else value, self._token):
            return continuation(handler_call_details)
        why = "no worker token" if not sent else "a wrong worker token"
        method = str(handler_call_details.method).rpartition("/")[2][:40]

        def refuse(request, context):
            self._log(method, why, context.peer())
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          f"{method} refused: {why}; this worker answers only calls that carry the site's worker "
                          f"token ({TOKEN_METADATA} metadata), from its token file (hacrl-fed client "
                          f"--worker-token-file, default <output_dir>/<agent>/{TOKEN_FILE})")

        return grpc.unary_unary_rpc_method_handler(refuse)

    def _log(self, method: str, why: str, peer: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last_log < self.LOG_EVERY_S:
                self._unlogged += 1
                return
            more, self._unlogged, self._last_log = self._unlogged, 0, now
        log.warning("%s refused: %s from %s%s", method, why, peer,
                    f" ({more} more refused calls since the last line)" if more else "")


class AgentWorkerServicer(wgrpc.AgentWorkerServicer):
    """``AgentWorker`` gRPC service over an :class:`~hacrl_fed.worker.agent.AgentWorker`."""

    def __init__(self, worker, *, slowdown: float = 1.0) -> None:
        self.worker, self.slowdown = worker, max(1.0, float(slowdown))   # agent.slowdown (docs/async.md)

    def _call(self, context: grpc.ServicerContext, fn, *args: Any, slowed: bool = False):
        """Run one operation; a refusal or failure is logged as one line (the site's terminal shows it; the
        traceback of an unexpected failure goes to the log file only) and returned as a status. ``slowed``: the
        answer waits (slowdown − 1) × the operation's time (the benchmark knob ``agent.slowdown``)."""
        t0 = time.monotonic()
        try:
            out = fn(*args)
            time.sleep((self.slowdown - 1.0) * (time.monotonic() - t0) if slowed else 0.0)
            return out
        except InvalidRequestError as err:
            code, message = grpc.StatusCode.INVALID_ARGUMENT, str(err)
        except PreconditionError as err:
            code, message = grpc.StatusCode.FAILED_PRECONDITION, str(err)
        except Exception as err:  # noqa: BLE001 - the server must survive any request
            detail_log.info("%s failed", fn.__name__, exc_info=True)
            code, message = grpc.StatusCode.INTERNAL, f"{type(err).__name__}: {' '.join(str(err).split())}"
        if code == grpc.StatusCode.INTERNAL:
            log.error("%s failed: %s", fn.__name__, message)
        else:
            log.warning("%s refused: %s", fn.__name__, message)
        context.abort(code, message)

    def Generate(self, request, context):
        return self._call(context, self.worker.generate, request.plan, request.notice, slowed=True)

    def Train(self, request, context):
        return self._call(context, self.worker.train, request, slowed=True)

    def Evaluate(self, request, context):
        return self._call(context, self.worker.evaluate, request)

    def Health(self, request, context):
        return self._call(context, self.worker.health)

    def Checkpoint(self, request, context):
        return self._call(context, self.worker.checkpoint, request)


def serve(worker, address: str, *, token: str, threads: int = 4, slowdown: float = 1.0) -> tuple[grpc.Server, str]:
    """Start a gRPC server for ``worker`` on ``address``; return it and the bound address. ``slowdown``: the
    benchmark knob ``agent.slowdown`` (:class:`AgentWorkerServicer`).

    Every call must carry ``token`` (:class:`TokenCheck`). ``127.0.0.1:0`` picks a free port (the returned
    address names it). Raises ``ValueError`` for a non-loopback address or an empty token, ``RuntimeError`` if
    the address cannot be bound (also when another process listens there: the port is never shared).
    """
    check_bind_address(address)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), interceptors=[TokenCheck(token)],
                         options=[*GRPC_OPTIONS, ("grpc.so_reuseport", 0)])  # a taken port fails, never shares
    wgrpc.add_AgentWorkerServicer_to_server(AgentWorkerServicer(worker, slowdown=slowdown), server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as err:
        raise RuntimeError(f"cannot bind the worker to {address}: {err}") from None
    if port == 0 and not address.startswith("unix:"):
        raise RuntimeError(f"cannot bind the worker to {address}")
    server.start()
    bound = address if address.startswith("unix:") else f"{address.rpartition(':')[0]}:{port}"
    return server, bound


class _CallDetails(collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                         "wait_for_ready", "compression")),
                   grpc.ClientCallDetails):
    pass


class _SendToken(grpc.UnaryUnaryClientInterceptor):
    """Adds the site's token to every call of a channel."""

    def __init__(self, token: str) -> None:
        self._metadata = ((TOKEN_METADATA, token),)

    def intercept_unary_unary(self, continuation, details, request):
        details = _CallDetails(details.method, details.timeout, tuple(details.metadata or ()) + self._metadata,
                               details.credentials, details.wait_for_ready, getattr(details, "compression", None))
        return continuation(details, request)


def connect(address: str, token: str) -> tuple[grpc.Channel, wgrpc.AgentWorkerStub]:
    """Insecure channel (loopback/unix) + stub with the raised message size limits; every call carries ``token``."""
    channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
    stub_channel = grpc.intercept_channel(channel, _SendToken(token)) if token else channel
    return channel, wgrpc.AgentWorkerStub(stub_channel)


def wait_healthy(stub: wgrpc.AgentWorkerStub, timeout_s: float = 60.0) -> wpb.HealthResponse:
    """Block until Health answers ready (or raise ``grpc.RpcError`` after ``timeout_s``)."""
    return stub.Health(wpb.HealthRequest(), timeout=timeout_s, wait_for_ready=True)


def _write_address(path: str | Path, address: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, address + "\n")


def run_worker(cfg, *, address: str | None = None, address_file: str | None = None, resume: bool = True,
               status_file: str | None = None, token_file: str | None = None, factory=None) -> None:
    """Load the agent of ``cfg`` (a ``ClientConfig``), serve it until SIGINT/SIGTERM. ``factory(agent, run_id=,
    status_file=)`` builds another worker with the same five operations instead of an ``AgentWorker`` (the CLI
    passes :class:`~hacrl_fed.contributor.EndpointWorker` for a site with ``agent.endpoint``: no model loaded).

    Every call must carry the token of ``token_file`` (default ``<output_dir>/<agent>/worker.token``; a new one
    is written there, mode 0600, when the file does not exist). Paths a Checkpoint call names must lie in the
    site's directory ``<output_dir>/<agent>/`` or the checkpoint directory. When healthy, prints ``worker <name>
    listening on <address>`` and writes the address to ``address_file`` (atomically). On SIGINT/SIGTERM it
    finishes the running request, checkpoints the trained steps no checkpoint holds yet
    (:meth:`~hacrl_fed.worker.agent.AgentWorker.save_on_shutdown`) and exits. ``status_file`` keeps its phase
    for a progress display (:mod:`hacrl_fed.status`).
    Raises ``ValueError`` for a non-loopback address or a bad token file
    (:class:`~hacrl_fed.protocol.worker_token.TokenFileError`) and the
    loading errors of :class:`~hacrl_fed.worker.agent.AgentWorker`.
    """
    from hacrl_fed.worker.agent import AgentWorker

    agent = cfg.agent
    addr = check_bind_address(address or agent.worker_address)
    site_dir = Path(cfg.output_dir) / agent.name
    token_path = Path(token_file) if token_file else site_dir / TOKEN_FILE
    token = ensure_token(token_path)                 # before the model loads: a bad file fails fast
    ckpt = agent.checkpoint_dir or str(site_dir / "checkpoints")
    if factory is not None:                        # e.g. a rollout-only site's EndpointWorker (no weights)
        worker = factory(agent, run_id=getattr(cfg, "run_id", None), status_file=status_file)
    else:
        worker = AgentWorker(agent, checkpoint_dir=ckpt, resume=resume, run_id=getattr(cfg, "run_id", None),
                             status_file=status_file, site_dir=site_dir)
    stop = threading.Event()
    try:
        server, bound = serve(worker, addr, token=token, slowdown=agent.slowdown)
        if agent.slowdown > 1.0:
            log.warning("agent.slowdown = %g: Generate and Train answer after %g× their time", *[agent.slowdown] * 2)
        _, stub = connect(bound, token)
        wait_healthy(stub)
        if address_file:
            _write_address(address_file, bound)
        print(f"worker {agent.name} listening on {bound} (token file: {token_path})", flush=True)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        stop.wait()
        server.stop(grace=5).wait()
        try:
            worker.save_on_shutdown()
        except Exception as err:  # noqa: BLE001 - reported; the previous checkpoint stays intact
            log.error("no checkpoint saved on shutdown: %s: %s", type(err).__name__, err)
    finally:
        worker.close()
