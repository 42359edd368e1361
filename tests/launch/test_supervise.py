"""Process supervision: no orphans, terminate-then-kill, signals, parent-death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from hacrl_fed.launch.processes import flwr_env, format_node_config, install_app, write_flwr_config
from hacrl_fed.launch.supervise import Shutdown, Supervisor, free_port, wait_for_tcp

# a child that starts a grandchild in its own session (as flower-superexec does) and then waits
SPAWNER = textwrap.dedent("""
    import subprocess, sys, time
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    print(p.pid, flush=True)
    time.sleep(600)
""")
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(600)"


def _wait_line(path, timeout=20.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = path.read_text() if path.exists() else ""
        if text.strip():
            return text.strip().splitlines()[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing written to {path}")


def test_stop_reaches_grandchildren_in_other_sessions(tmp_path):
    with Supervisor(tmp_path) as sup:
        proc = sup.start("spawner", [sys.executable, "-c", SPAWNER])
        grandchild = int(_wait_line(proc.log_path))
        assert psutil.pid_exists(grandchild)
        assert os.getsid(grandchild) != os.getsid(proc.pid)
    assert not proc.alive()
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_output_is_logged_without_colour_codes_teed_through_a_filter_and_handed_to_a_callback(tmp_path):
    import io

    child = ("print('\\x1b[92mINFO \\x1b[0m:      shown'); print('\\x1b[93mWARNING \\x1b[0m:   hidden');"
             "print('no newline at the end', end='')")
    echo, lines = io.StringIO(), []
    with Supervisor(tmp_path) as sup:
        proc = sup.start("child", [sys.executable, "-c", child], echo=echo,
                         echo_filter=lambda line: "hidden" not in line, on_line=lines.append)
        proc.popen.wait(20)
        proc._threads[0].join(5)
    assert proc.log_path.read_text() == "INFO :      shown\nWARNING :   hidden\nno newline at the end"
    assert echo.getvalue() == "[child] INFO :      shown\n[child] no newline at the end\n"
    assert lines == ["INFO :      shown", "WARNING :   hidden", "no newline at the end"]


def test_sigterm_ignorers_are_killed_after_the_grace_period(tmp_path):
    sup = Supervisor(tmp_path, grace_s=0.5)
    proc = sup.start("stubborn", [sys.executable, "-c", STUBBORN])
    _wait_line(proc.log_path)
    t0 = time.monotonic()
    code = sup.stop(proc)
    assert code == -signal.SIGKILL and time.monotonic() - t0 < 8
    assert sup.procs == []


def test_signals_become_shutdown_and_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Shutdown) as info, Supervisor(tmp_path) as sup:
        sup.handle_signals()
        proc = sup.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert info.value.signum == signal.SIGTERM
    assert not proc.alive()
    assert signal.getsignal(signal.SIGTERM) is before


def _kill_and_expect_child_gone(script: str, parent: str) -> None:
    """Run ``script`` (it prints its child's pid), SIGKILL it, and wait up to 10 s for that child to be gone."""
    outer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(outer.stdout.readline())
    assert psutil.pid_exists(child)
    outer.kill()
    outer.wait()
    end = time.monotonic() + 10
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end, f"child outlived its SIGKILLed {parent}"
        time.sleep(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_killed_supervisor(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from hacrl_fed.launch.supervise import Supervisor
        sup = Supervisor({str(tmp_path)!r})
        p = sup.start("child", [sys.executable, "-c", "import time; time.sleep(600)"])
        print(p.pid, flush=True)
        time.sleep(600)
    """)
    _kill_and_expect_child_gone(script, "supervisor")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_plain_subprocess_with_die_with_parent_dies_with_its_killed_parent():
    """What the benchmark drivers (benchmarks/specialists.py) use for their ``simulate`` and ``route eval`` children:
    ``subprocess.run(..., preexec_fn=die_with_parent)`` outlives no SIGKILLed parent."""
    script = textwrap.dedent("""
        import subprocess, sys
        from hacrl_fed.launch.supervise import die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=die_with_parent)
        print(child.pid, flush=True)
        child.wait()
    """)
    _kill_and_expect_child_gone(script, "parent")


def test_wait_for_tcp_and_free_port():
    import socket

    port = free_port()
    with pytest.raises(TimeoutError):
        wait_for_tcp("127.0.0.1", port, 0.3)
    with pytest.raises(RuntimeError, match="exited"):
        wait_for_tcp("127.0.0.1", port, 5, alive=lambda: False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        wait_for_tcp("127.0.0.1", port, 5)


def test_flower_files(tmp_path):
    import tomllib

    cfg = write_flwr_config(tmp_path / "home", "127.0.0.1:9999", insecure=False, root_certificates="ca.crt")
    conn = tomllib.loads(cfg.read_text())["superlink"]
    assert conn["default"] == "hacrl" and conn["hacrl"]["address"] == "127.0.0.1:9999"
    assert conn["hacrl"]["root-certificates"] == str((tmp_path.cwd() / "ca.crt").absolute())
    app = tomllib.loads((install_app(tmp_path / "app") / "pyproject.toml").read_text())
    assert app["tool"]["flwr"]["app"]["components"] == {"serverapp": "hacrl_fed.flower.server_app:app",
                                                        "clientapp": "hacrl_fed.flower.client_app:app"}
    assert "config-path" in app["tool"]["flwr"]["app"]["config"]
    env = flwr_env(tmp_path / "home", {"PATH": "/usr/bin"})
    assert env["FLWR_TELEMETRY_ENABLED"] == "0" and env["FLWR_HOME"] == str((tmp_path / "home").absolute())
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert format_node_config({"agent-name": "a-1", "worker-address": "127.0.0.1:5"}) == \
        'agent-name="a-1" worker-address="127.0.0.1:5"'
    with pytest.raises(ValueError):
        format_node_config({"agent-name": 'x" evil="1'})


ROOT = Path(__file__).resolve().parents[2]


def kit_client_configs(root: Path = ROOT) -> list[Path]:
    """The site configs the client kit ships: ``client/*.toml`` under ``root`` without what the how-tos create
    beside them (``roster.toml`` …), which the repository's ``.gitignore`` names."""
    found = sorted((root / "client").glob("*.toml"))
    names = [f"client/{p.name}" for p in found]
    try:
        res = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"], input="\n".join(names),
                             capture_output=True, text=True, timeout=30)
        ignored = set(res.stdout.split()) if res.returncode in (0, 1) else {"client/roster.toml"}
    except OSError:                      # no git: the one config-like file a how-to puts there
        ignored = {"client/roster.toml"}
    return [p for p, name in zip(found, names) if name not in ignored]


def test_a_stray_roster_in_the_client_kit_is_not_taken_for_a_site_config(tmp_path):
    """The local trial used to copy roster.toml into client/, where this check then read it as a site config."""
    (tmp_path / "client").mkdir()
    for path in kit_client_configs():
        (tmp_path / "client" / path.name).write_text(path.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "client" / "roster.toml").write_text((ROOT / "server" / "roster.example.toml").read_text())
    assert [p.name for p in kit_client_configs(tmp_path)] == [p.name for p in kit_client_configs()]


def test_deployment_kit_configs_are_valid():
    """The example configs in server/ and client/ load with the current schema."""
    from hacrl_fed.config import ClientConfig, ServerConfig, load_config
    from hacrl_fed.protocol.keys import Roster

    server = load_config(ROOT / "server" / "server.toml", ServerConfig)
    assert server.superlink.node_auth and not server.superlink.insecure
    assert len(Roster.load(ROOT / "server" / "roster.example.toml")) == 2
    clients = kit_client_configs()
    assert len(clients) >= 2
    for path in clients:
        cfg = load_config(path, ClientConfig)
        assert cfg.node_key and cfg.root_certificates and cfg.agent.private_key and cfg.agent.roster, path


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_grandchildren_in_their_own_session_die_with_a_killed_supervisor(tmp_path):
    """The death signal reaches only direct children; the guardian stops what they started, also in a session
    of its own (Flower's superexec and ServerApp), whatever killed the supervisor."""
    grandchild = ("import subprocess, sys, time; "
                  "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
                  "print(p.pid, flush=True); time.sleep(600)")
    script = textwrap.dedent(f"""
        import sys, time
        from hacrl_fed.launch.supervise import Supervisor
        sup = Supervisor({str(tmp_path)!r})
        p = sup.start("child", [sys.executable, "-c", {grandchild!r}])
        print(p.pid, flush=True)
        time.sleep(600)
    """)
    outer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(outer.stdout.readline())
    log = tmp_path / "child.log"
    end = time.monotonic() + 20
    while not (log.exists() and log.read_text().strip()):
        assert time.monotonic() < end
        time.sleep(0.1)
    orphan = psutil.Process(int(log.read_text().split()[0]))
    time.sleep(1.5)  # the guardian looks twice a second
    outer.kill()
    outer.wait()
    end = time.monotonic() + 10
    while orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end, "a grandchild outlived its SIGKILLed supervisor"
        time.sleep(0.1)
    # the child gets its death signal at once, but on a loaded machine it may be scheduled after the grandchild
    while not _gone(child):
        assert time.monotonic() < end, "a child outlived its SIGKILLed supervisor"
        time.sleep(0.1)


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie waiting for its parent)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
