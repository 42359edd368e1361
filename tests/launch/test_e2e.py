"""End to end over a real SuperLink and SuperNodes on 127.0.0.1, with TLS and SuperNode authentication.

One run exercises every scenario (start-up costs dominate, so they share it):

* ``hacrl-fed server`` + four ``hacrl-fed client`` sites: alice (tiny-llama-bpe), bob
  (tiny-gemma-unigram), carol (tiny-llama-bpe) with real agent workers, and mallory, whose worker is
  an attacker returning a different hostile envelope at every step;
* bob's site is stopped while step 2 is under way: the step finishes with the others; bob's site is
  restarted, its worker resumes from its checkpoint and bob trains again in a later step;
* the coordinator is stopped after step 3 and started again: the run resumes at the persisted step;
* mallory is rejected at every step with the expected reason and is never sent the pool;
* finally every site is stopped with SIGTERM and no process is left behind.
"""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import psutil
import pytest

from fedutil import make_federation
from hacrl_fed.launch.supervise import free_port
from hacrl_fed.protocol.certs import generate_tls
from hostile import HOSTILE

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
STEPS = 6
CASES = ["tampered", "replay", "nan_reward", "non_utf8", "unknown_agent", "duplicate_sample", "missing_samples",
         "oversized", "wrong_run", "foreign_key"]
MODELS = {"alice": "tiny-llama-bpe", "bob": "tiny-gemma-unigram", "carol": "tiny-llama-bpe"}
MAX_BATCH_BYTES = 256 * 1024


def case_of(step: int) -> str:
    return CASES[(step - 1) % len(CASES)]


class Deployment:
    """Files and processes of one coordinator and its sites, all on loopback."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fed = make_federation(root / "keys", [*MODELS, "mallory"])
        tls = generate_tls(root / "tls", ["127.0.0.1", "localhost"])
        self.ca = tls.ca_cert
        self.port = free_port()
        self.env = dict(os.environ, HACRL_FED_CACHE=str(root / "model-cache"), PYTHONUNBUFFERED="1")
        self.procs: dict[str, subprocess.Popen] = {}
        self.all_pids: set[int] = set()
        (root / "server.toml").write_text(f"""
roster = "{self.fed.roster_path}"
[run]
run_id = "e2e"
steps = {STEPS}
prompts_per_step = 2
samples_per_prompt = 2
min_agents = 2
generate_timeout_s = 60
train_timeout_s = 60
join_timeout_s = 45
max_batch_bytes = {MAX_BATCH_BYTES}
output_dir = "{root / 'coordinator'}"
[run.sampling]
max_new_tokens = 12
[run.data]
num_problems = 40
eval_size = 0
[superlink]
port = {self.port}
ca_cert = "{tls.ca_cert}"
server_cert = "{tls.server_cert}"
server_key = "{tls.server_key}"
[verifier]
workers = 1
""")
        for agent, model in MODELS.items():
            self.client_toml(agent, model)

    def client_toml(self, agent: str, model: str) -> Path:
        path = self.root / f"{agent}.toml"
        path.write_text(f"""
superlink = "127.0.0.1:{self.port}"
root_certificates = "{self.ca}"
node_key = "{self.fed.node_key_file(agent)}"
output_dir = "{self.root / 'sites'}"
[agent]
name = "{agent}"
private_key = "{self.fed.key_file(agent)}"
roster = "{self.fed.roster_path}"
[agent.model]
name_or_path = "{model}"
[agent.verifier]
workers = 1
""")
        return path

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.root,
                                start_new_session=True)
        log.close()
        self.procs[name] = proc
        self.all_pids.add(proc.pid)
        return proc

    def cli(self, name: str, *args: str) -> subprocess.Popen:
        return self.start(name, [sys.executable, "-m", "hacrl_fed.cli", *args])

    def start_server(self) -> subprocess.Popen:
        return self.cli("server", "server", "--config", str(self.root / "server.toml"))

    def start_site(self, agent: str) -> subprocess.Popen:
        return self.cli(agent, "client", "--config", str(self.root / f"{agent}.toml"))

    def start_attacker(self) -> subprocess.Popen:
        addr = self.root / "mallory.address"
        worker = self.start("mallory-worker", [
            sys.executable, str(HELPERS / "fake_worker.py"), "--name", "mallory",
            "--key", str(self.fed.key_file("mallory")), "--stranger-key", str(self.fed.root / "eve.ed25519.key"),
            "--cases", ",".join(CASES), "--max-bytes", str(MAX_BATCH_BYTES), "--address-file", str(addr),
            "--log", str(self.root / "mallory-calls.jsonl"),
            "--token-file", str(self.root / "sites" / "mallory" / "worker.token")])   # the client's default
        wait_for(lambda: addr.exists() or worker.poll() is not None, 60, "attacker worker address")
        return self.cli("mallory", "client", "--name", "mallory", "--model", "none", "--server",
                        f"127.0.0.1:{self.port}", "--root-certificates", str(self.ca),
                        "--node-key", str(self.fed.node_key_file("mallory")), "--output-dir",
                        str(self.root / "sites"), "--worker-address", addr.read_text().strip())

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        proc = self.procs[name]
        self.track()
        proc.send_signal(sig)
        return proc.wait(timeout)

    def track(self) -> None:
        """Remember every descendant of our processes (to check for orphans at the end)."""
        for proc in self.procs.values():
            try:
                self.all_pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            except psutil.Error:
                pass

    def metrics(self) -> list[dict]:
        path = self.root / "coordinator" / "e2e" / "metrics.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def steps_done(self) -> list[int]:
        return [r["step"] for r in self.metrics() if r["event"] == "step"]

    def log(self, name: str) -> str:
        return (self.root / f"{name}.out").read_text(errors="replace")

    def cleanup(self) -> None:
        self.track()
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    def leftovers(self) -> list[str]:
        alive = []
        for pid in self.all_pids:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(p.cmdline())[:120]}")
            except psutil.Error:
                pass
        return alive


def wait_for(cond, timeout: float, what: str, dep: Deployment | None = None) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            tail = "" if dep is None else "\n".join(dep.log("server").splitlines()[-40:])
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{tail}")
        time.sleep(0.25)


@pytest.fixture
def deployment(tmp_path):
    dep = Deployment(tmp_path)
    yield dep
    dep.cleanup()


def test_federation_end_to_end(deployment):
    dep = deployment
    dep.start_server()
    for agent in MODELS:
        dep.start_site(agent)
    dep.start_attacker()

    # --- bob's site goes away while step 2 is under way, and comes back
    wait_for(lambda: 1 in dep.steps_done(), 240, "step 1", dep)
    time.sleep(1.0)
    assert dep.stop("bob") == 0
    dep.start_site("bob")

    # --- the coordinator is stopped after step 3 and started again
    wait_for(lambda: 3 in dep.steps_done(), 240, "step 3", dep)
    assert dep.stop("server") == 128 + signal.SIGTERM
    persisted = json.loads((dep.root / "coordinator" / "e2e" / "coordinator" / "state.json").read_text())["step"]
    assert persisted >= 3
    server = dep.start_server()
    assert server.wait(300) == 0, dep.log("server")[-3000:]

    records = dep.metrics()
    steps = {r["step"]: r for r in records if r["event"] == "step"}
    assert sorted(steps) == list(range(1, STEPS + 1))  # every step exactly once, despite the restart
    assert [r["step"] for r in records if r["event"] == "resume"] == [persisted]
    # a step whose train phase the coordinator's stop cut short counts as done (never trained twice)
    assert [s for s, r in steps.items() if r.get("interrupted")] in ([], [persisted])

    for step, r in steps.items():
        mal = r["agents"]["mallory"]
        assert mal["status"] == "rejected" and mal["reason"] == HOSTILE[case_of(step)][1].value, (step, mal)
        assert mal["detail"] and mal["rows_accepted"] == 0
        assert "mallory" not in r["participants"], r
        if r.get("interrupted"):  # done, but not recorded as trained: the sites' next batches say who trained it
            assert r["trained"] is False and all(a["status"] != "trained" for a in r["agents"].values()), r
            continue
        assert r["trained"], r
        trained = {a for a in r["participants"] if r["agents"][a]["status"] == "trained"}
        missed = {a: r["agents"].get(a) for a in ("alice", "carol") if a not in trained}
        if missed and step == persisted + 1:
            # the restarted coordinator's first step: a site whose SuperNode is still reconnecting, or that
            # refuses an order of the stopped coordinator, may miss this one step with its reason recorded (the
            # warning keeps what happened visible in the test report); every honest site trains the last step
            assert all(m is None or (m["status"] != "trained" and m["reason"]) for m in missed.values()), missed
            warnings.warn(f"step {step}, first after the coordinator's restart, without {sorted(missed)}: {missed}")
        else:
            assert not missed, (step, missed, {a: dep.log(a)[-1500:] for a in missed}, dep.log("server")[-3000:])
        for agent in trained:
            a = r["agents"][agent]
            assert a["rows_accepted"] == 4 and a["bytes_in"] > 0 and a["bytes_out"] > 0, (step, agent, a)
            assert a["reward_disagreements"] == 0, (step, agent, a)  # same verifier on both sides
    last = steps[STEPS]
    last_trained = {a for a in last["participants"] if last["agents"][a]["status"] == "trained"}
    assert STEPS == persisted + 1 or set(MODELS) <= last_trained, (last["agents"], dep.log("server")[-3000:])
    # bob's site went down during step 2: the step finished with the others, bob trained again later
    assert steps[1]["agents"]["bob"]["status"] == "trained"
    assert steps[2]["agents"]["bob"]["status"] in ("train_error", "error", "timeout"), steps[2]["agents"]["bob"]
    assert any(steps[s]["agents"].get("bob", {}).get("status") == "trained" for s in range(3, STEPS + 1))
    # the restarted worker resumed from its checkpoint: step 1, or step 2 when the stop reached the site while the
    # worker was already training step 2 (it finishes the request and saves it on shutdown; the coordinator,
    # whose train order went unanswered, records step 2 for bob as failed either way)
    resumed = [int(n) for n in re.findall(r"worker bob ready at \S+ \(last trained step (\d+)\)", dep.log("bob"))]
    assert len(resumed) == 2 and resumed[0] == 0 and resumed[1] in (1, 2), resumed
    calls = [json.loads(line) for line in (dep.root / "mallory-calls.jsonl").read_text().splitlines()]
    assert calls and not any(c["rpc"] == "Train" for c in calls)
    notices = [c["notice"] for c in calls if c.get("notice")]  # the attacker's site is told every refusal
    assert notices and all(": your batch was not pooled (" in n for n in notices), notices

    # --- every site shuts down cleanly; nothing is left running
    sites = [*MODELS, "mallory", "mallory-worker"]
    dep.track()
    for name in sites:
        dep.procs[name].send_signal(signal.SIGTERM)
    for name in sites:
        assert dep.procs[name].wait(60) == 0, dep.log(name)[-2000:]
    time.sleep(1.0)
    assert dep.leftovers() == []
