"""An asynchronous run whose coordinator is killed (SIGKILL of ``hacrl-fed server``'s whole process group: the
SuperLink and the ServerApp with it) resumes with ``hacrl-fed server`` and ends with records equal to what every
site's weights hold. Minutes of CPU on a loaded machine: marked slow."""

from __future__ import annotations

import json
import os
import signal

import pytest

from test_async_e2e import STEPS, deployment  # noqa: F401 - the async deployment fixture
from test_e2e import MODELS, wait_for


@pytest.mark.slow
def test_an_async_run_killed_at_its_coordinator_resumes_with_hacrl_fed_server(deployment):  # noqa: F811
    dep = deployment
    server = dep.start_server()
    for agent in MODELS:
        dep.start_site(agent)

    def trained() -> int:
        return sum(r.get("event") == "update" and r.get("status") == "trained" for r in dep.metrics())

    wait_for(lambda: trained() >= 2, 600, "two updates", dep)
    dep.track()
    os.killpg(server.pid, signal.SIGKILL)
    server.wait(60)
    server = dep.start_server()
    wait_for(lambda: server.poll() is not None, 900, "the resumed run to end", dep)
    assert server.returncode == 0, dep.log("server")[-3000:]
    records = dep.metrics()
    assert [r["event"] for r in records if r.get("event") in ("run_start", "resume")] == ["run_start", "resume"]
    end = [r for r in records if r.get("event") == "run_end"][-1]
    state = json.loads((dep.root / "coordinator" / "e2e" / "coordinator" / "state.json").read_text())
    for agent in MODELS:
        held = state["trained_steps"][agent]
        assert end["updates"][agent] == len(held) == end["totals"][agent]["steps_trained"] == STEPS, end
    assert end["ended_short"] == {}
    for agent in MODELS:
        assert dep.stop(agent) == 0
