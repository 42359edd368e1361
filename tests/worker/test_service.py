"""gRPC service round trip over loopback and a unix socket; error mapping; the worker command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import grpc
import pytest

from hacrl_fed.protocol.worker_token import TOKEN_METADATA
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.v1 import worker_pb2_grpc as wgrpc
from hacrl_fed.worker.service import check_bind_address, connect, serve, wait_healthy

KINDS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram"}
TOKEN = "t" * 43


@pytest.mark.parametrize("address", ["0.0.0.0:0", "192.168.1.7:5000", "example.com:80", "[::]:0", "127.0.0.1",
                                     "unix:", "127.0.0.1:99999"])
def test_non_loopback_addresses_are_refused(address):
    with pytest.raises(ValueError):
        check_bind_address(address)


@pytest.mark.parametrize("address", ["127.0.0.1:0", "localhost:5000", "[::1]:7", "unix:/tmp/w.sock"])
def test_loopback_addresses_are_accepted(address):
    assert check_bind_address(address) == address


def _code(call, *args, **kw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, **kw)
    return info.value.code(), info.value.details()


def test_round_trip_and_error_mapping(make_sites, plans, tmp_path):
    make_plan, make_table = plans
    sites = make_sites(KINDS)
    servers, stubs = [], {}
    try:
        for name, address in (("alice", "127.0.0.1:0"), ("bob", f"unix:{tmp_path}/bob.sock")):
            server, bound = serve(sites.start(name), address, token=TOKEN)
            servers.append(server)
            stubs[name] = connect(bound, TOKEN)[1]
        assert wait_healthy(stubs["alice"]).agent_id == "alice"
        health = stubs["bob"].Health(wpb.HealthRequest())
        assert (health.agent_id, health.ready, health.step, health.device) == ("bob", True, 0, "cpu")

        plan = make_plan(1)
        gen = {n: s.Generate(wpb.GenerateRequest(plan=plan)) for n, s in stubs.items()}
        assert gen["alice"].envelope.key_id == "alice" and gen["alice"].metrics["rollouts"] == 6
        batch = pb.RolloutBatch.FromString(gen["bob"].envelope.payload)
        assert batch.model_fingerprint == health.model_fingerprint and batch.sampling.max_new_tokens == 10
        envs = [g.envelope for g in gen.values()]
        fixes = [("alice", r.prompt_id, r.sample_index, 1.0)
                 for r in pb.RolloutBatch.FromString(envs[0].payload).rollouts if r.sample_index == 1]
        table = make_table(plan, {"alice": 0.4, "bob": 0.2}, corrections=fixes)
        for name, stub in stubs.items():
            report = stub.Train(wpb.TrainRequest(run_id="run-a", step=1, envelopes=envs, capabilities=table, plan=plan))
            assert report.agent_id == name and not report.rejected
            assert {s.source_agent for s in report.per_source} == {"alice", "bob"}
        assert stubs["alice"].Health(wpb.HealthRequest()).step == 1

        ev = stubs["alice"].Evaluate(wpb.EvaluateRequest(prompts=plan.prompts, samples=2,
                                                         sampling=pb.SamplingParams(temperature=1.0, max_new_tokens=6)))
        assert [r.total for r in ev.results] == [2, 2, 2] and "avg@2" in ev.metrics and "pass@2" in ev.metrics
        saved = stubs["alice"].Checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE))
        assert saved.step == 1 and os.path.isfile(os.path.join(saved.path, "state.json"))
        exported = stubs["bob"].Checkpoint(wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT,
                                                                 path=str(sites.root / "bob" / "bob-export")))
        assert os.path.isfile(os.path.join(exported.path, "model.safetensors"))
        outside = tmp_path / "elsewhere"
        for kind in (wpb.CheckpointRequest.EXPORT, wpb.CheckpointRequest.SAVE):      # issue 25 D3: only the site's
            code, msg = _code(stubs["bob"].Checkpoint, wpb.CheckpointRequest(kind=kind, path=str(outside)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "CheckpointRequest.path" in msg and "outside" in msg
        assert not outside.exists()
        code, msg = _code(stubs["bob"].Checkpoint, wpb.CheckpointRequest(kind=wpb.CheckpointRequest.SAVE,
                                                                         path="../alice/checkpoints"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "'..'" in msg

        alice = stubs["alice"]
        assert _code(alice.Generate, wpb.GenerateRequest(plan=pb.RoundPlan(run_id="run-a", step=2,
                                                                           samples_per_prompt=2)))[0] \
            == grpc.StatusCode.INVALID_ARGUMENT
        bad_sampling = make_plan(2)
        bad_sampling.sampling.top_p = 2.0
        code, msg = _code(alice.Generate, wpb.GenerateRequest(plan=bad_sampling))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in msg
        code, msg = _code(alice.Generate, wpb.GenerateRequest(plan=make_plan(2, run_id="another-run")))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "another-run" in msg
        code, msg = _code(alice.Train, wpb.TrainRequest(run_id="run-a", step=5, plan=make_plan(5)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "Generate" in msg
        (sites.root / "alice" / "taken").mkdir()
        (sites.root / "alice" / "taken" / "notes.txt").write_text("not a model")
        code, msg = _code(alice.Checkpoint, wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT, path="taken"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "not an exported model" in msg
        assert (sites.root / "alice" / "taken" / "notes.txt").is_file()
        assert alice.Health(wpb.HealthRequest()).ready          # the server survived every error
    finally:
        for server in servers:
            server.stop(grace=None)


def test_worker_command_writes_address_and_stops_on_sigterm(make_sites, tmp_path, model_cache):
    sites = make_sites({"carol": "tiny-gemma-unigram"})
    cfg = sites.cfg["carol"]
    toml = tmp_path / "client.toml"
    toml.write_text(
        f'output_dir = "{tmp_path}/out"\n'
        f'[agent]\nname = "carol"\nprivate_key = "{cfg.private_key}"\nroster = "{cfg.roster}"\n'
        f'checkpoint_dir = "{tmp_path}/ck"\n[agent.verifier]\nworkers = 1\n'
        f'[agent.model]\nname_or_path = "tiny-gemma-unigram"\ncache_dir = "{model_cache}"\n')
    refused = subprocess.run([sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(toml),
                              "--address", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "refusing to bind" in refused.stderr
    addr_file = tmp_path / "addr"
    proc = subprocess.Popen([sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(toml),
                             "--address", "127.0.0.1:0", "--address-file", str(addr_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not addr_file.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert addr_file.exists(), proc.stderr.read() if proc.poll() is not None else "timeout"
        address = addr_file.read_text().strip()
        assert address.startswith("127.0.0.1:") and not address.endswith(":0")
        plain = wgrpc.AgentWorkerStub(grpc.insecure_channel(address))      # any local process, no token
        code, msg = _code(plain.Health, wpb.HealthRequest(), timeout=30)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "worker token" in msg
        code, _ = _code(plain.Checkpoint, wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT,
                                                                path=str(tmp_path / "stolen")), timeout=30)
        assert code == grpc.StatusCode.UNAUTHENTICATED and not (tmp_path / "stolen").exists()
        token_file = tmp_path / "out" / "carol" / "worker.token"              # the default, written by the worker
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert connect(address, token)[1].Health(wpb.HealthRequest(), timeout=30).agent_id == "carol"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and f"listening on {address}" in out
    assert "Health refused: no worker token" in out + err                     # the refusal is logged


class _Worker:
    """Just enough of an AgentWorker for the service (no model)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def health(self):
        self.calls.append("health")
        return wpb.HealthResponse(agent_id="x", ready=True)

    def generate(self, plan, notice):
        self.calls.append("generate")
        return wpb.GenerateResponse()


def test_every_call_must_carry_the_sites_token(caplog):
    """Issue 25 D3: a local process that reaches the port but lacks the token is refused UNAUTHENTICATED before
    its request is read; the server keeps serving."""
    worker = _Worker()
    server, bound = serve(worker, "127.0.0.1:0", token=TOKEN)
    try:
        plain = wgrpc.AgentWorkerStub(grpc.insecure_channel(bound))
        with caplog.at_level("WARNING", logger="hacrl_fed.worker"):
            code, msg = _code(plain.Health, wpb.HealthRequest(), timeout=10)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "no worker token" in msg and TOKEN_METADATA in msg
        assert any("Health refused: no worker token" in r.getMessage() for r in caplog.records)
        for sent in ((TOKEN_METADATA, "u" * 43),), ((TOKEN_METADATA, TOKEN[:-1]),), \
                ((TOKEN_METADATA, "u" * 43), (TOKEN_METADATA, TOKEN)):
            code, msg = _code(plain.Generate, wpb.GenerateRequest(plan=pb.RoundPlan(step=1)), metadata=sent,
                              timeout=10)
            assert code == grpc.StatusCode.UNAUTHENTICATED and "wrong worker token" in msg
        assert worker.calls == []
        assert connect(bound, TOKEN)[1].Health(wpb.HealthRequest(), timeout=10).ready
        assert worker.calls == ["health"]
    finally:
        server.stop(grace=None)
    with pytest.raises(ValueError, match="token"):
        serve(worker, "127.0.0.1:0", token="")


def test_a_taken_worker_port_is_never_shared():
    """gRPC servers set SO_REUSEPORT by default: a second worker on a taken port would silently share it."""
    import socket

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        with pytest.raises(RuntimeError, match="cannot bind the worker to 127.0.0.1:"):
            serve(object(), f"127.0.0.1:{holder.getsockname()[1]}", token=TOKEN)
    finally:
        holder.close()


def test_the_slowdown_knob_makes_generate_take_that_many_times_as_long():
    """``agent.slowdown`` (the async benchmark's slow site): the answer comes after slowdown × the call's own time."""

    class Slow(_Worker):
        def generate(self, plan, notice):
            time.sleep(0.1)
            return super().generate(plan, notice)

    server, bound = serve(Slow(), "127.0.0.1:0", token=TOKEN, slowdown=3.0)
    try:
        stub = connect(bound, TOKEN)[1]
        t0 = time.monotonic()
        stub.Generate(wpb.GenerateRequest(plan=pb.RoundPlan(step=1)), timeout=30)
        took = time.monotonic() - t0
    finally:
        server.stop(grace=None)
    assert took >= 0.3, took
