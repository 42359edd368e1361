"""Exchanges under a relay that resets every SuperNode↔SuperLink connection on a schedule (issue 25 B).

A real ``flower-superlink`` (TLS by default, as ``hacrl-fed server`` runs it), a
:class:`tests/helpers/relay.CuttingRelay` in front of it resetting every connection each ``--every-s``
seconds, ``--nodes`` ``flower-supernode`` s through the relay, each with a fake worker in this process that
takes ``--work-s`` per call, and the ServerApp of ``tests/helpers/delivery_app.py`` running ``--exchanges``
exchanges in a row with the coordinator's FlowerTransport (train orders with a ``--pool-mib`` pool and the
next plan, as the coordinator sends them). Prints one line per exchange and a summary (answered, timed out,
errors, orders sent again, connections cut), and writes it as JSON with ``--out``.

    PATH=.venv/bin:$PATH PYTHONPATH=. python benchmarks/bench_delivery_cuts.py --every-s 20 --exchanges 12

Runs the checkout it lies in (``PYTHONPATH`` of every Flower process): copy it into another checkout to
measure that one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "helpers"
sys.path[:0] = [str(ROOT), str(HELPERS)]

import fake_worker  # noqa: E402
from fake_worker import FakeWorker  # noqa: E402
from fedutil import make_federation  # noqa: E402
from delivery_manifest import delivery_app_dir  # noqa: E402
from relay import CuttingRelay  # noqa: E402

from hacrl_fed.launch import processes as launch  # noqa: E402
from hacrl_fed.launch.supervise import Supervisor, free_port  # noqa: E402
from hacrl_fed.protocol.certs import generate_tls  # noqa: E402
from hacrl_fed.protocol.worker_token import write_token  # noqa: E402


class SlowWorker(FakeWorker):
    """A fake worker whose Generate and Train take ``work_s`` seconds."""

    work_s = 0.0

    def Generate(self, request, context):
        time.sleep(self.work_s)
        return super().Generate(request, context)

    def Train(self, request, context):
        time.sleep(self.work_s)
        return super().Train(request, context)


def _env(home: Path) -> dict[str, str]:
    env = launch.flwr_env(home)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HELPERS)])
    return env


def _count(path: Path, text: str) -> int:
    return path.read_text(encoding="utf-8", errors="replace").count(text) if path.exists() else 0


def run(args: argparse.Namespace, root: Path) -> dict:
    fed = make_federation(root / "keys", [f"org{i}" for i in range(args.nodes)])
    SlowWorker.work_s = args.work_s
    servers, nodes = [], []
    for i in range(args.nodes):
        token_file = root / f"org{i}" / "worker.token"
        server, address = fake_worker.serve(SlowWorker(f"org{i}", fed.keys[f"org{i}"]), token=write_token(token_file))
        servers.append(server)
        nodes.append((f"org{i}", address, token_file))
    out, port = root / "result.json", free_port()
    tls = None if args.insecure else generate_tls(root / "tls", ["127.0.0.1", "localhost"])
    link_home = root / "flwr-link"
    launch.write_flwr_config(link_home, f"127.0.0.1:{port}", insecure=args.insecure,
                             root_certificates=None if tls is None else str(tls.ca_cert))
    config = {"out-path": str(out), "timeout-s": args.timeout_s, "nodes": args.nodes, "exchanges": args.exchanges,
              "kind": "train", "pool-mib": args.pool_mib}
    t0 = time.monotonic()
    with Supervisor(root / "logs") as sup:
        tls_args = {} if tls is None else {"ca_cert": str(tls.ca_cert), "server_cert": str(tls.server_cert),
                                           "server_key": str(tls.server_key)}
        launch.start_superlink(sup, host="127.0.0.1", port=port, database=root / "superlink.db", env=_env(link_home),
                               insecure=args.insecure, node_auth=False, **tls_args)
        with CuttingRelay(port, every_s=args.every_s) as relay:
            for name, address, token_file in nodes:
                launch.start_supernode(sup, f"supernode-{name}", superlink=f"127.0.0.1:{relay.port}",
                                       port=free_port(), env=_env(root / name / "flwr"), insecure=args.insecure,
                                       root_certificates=None if tls is None else str(tls.ca_cert),
                                       node_config={"agent-name": name, "worker-address": address,
                                                    "worker-token-file": str(token_file)})
            app = delivery_app_dir(root, config, name="delivery-bench", publisher="hacrl-fed-bench")
            run_proc = launch.start_run(sup, app, {}, env=_env(link_home))
            while not out.exists():
                if not run_proc.alive() and not out.exists():
                    raise RuntimeError(f"flwr run exited ({run_proc.returncode}):\n{run_proc.tail(40)}")
                time.sleep(1.0)
            cuts = relay.cuts
    for server in servers:
        server.stop(grace=0)
    results = json.loads(out.read_text())
    logs = root / "logs"
    node_logs = [logs / f"supernode-{n}.log" for n, _, _ in nodes]
    return {
        "every_s": args.every_s, "tls": not args.insecure, "nodes": args.nodes, "exchanges": args.exchanges,
        "timeout_s": args.timeout_s, "pool_mib": args.pool_mib, "work_s": args.work_s,
        "answered": sum(not r["timed_out"] and not r["error"] for r in results),
        "timed_out": sum(r["timed_out"] for r in results),
        "errors": [r["error"] for r in results if r["error"]],
        "exchange_s": [round(r["exchange_s"], 1) for r in results],
        "sent_again": _count(logs / "flwr-run.log", "sending it again"),
        "connections_cut": cuts,
        "supernode_failed_to_receive": sum(_count(p, "Failed to receive message") for p in node_logs),
        "supernode_failed_to_send": sum(_count(p, "Failed to send message") for p in node_logs),
        "supernode_gave_up": sum(_count(p, "Giving up") + _count(p, "SSL/TLS handshake error") for p in node_logs),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every-s", type=float, default=20.0, help="reset every connection this often (s)")
    ap.add_argument("--exchanges", type=int, default=12)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=90.0, help="each exchange's timeout (s)")
    ap.add_argument("--pool-mib", type=float, default=16.0, help="size of the pool each train order carries (MiB)")
    ap.add_argument("--work-s", type=float, default=2.0, help="seconds the fake worker takes per call")
    ap.add_argument("--insecure", action="store_true", help="plain HTTP instead of TLS")
    ap.add_argument("--out", type=Path, help="write the summary as JSON here")
    ap.add_argument("--dir", type=Path, help="work here (logs kept) instead of in a temporary directory")
    args = ap.parse_args()
    if args.dir:
        args.dir.mkdir(parents=True)
        summary = run(args, args.dir)
    else:
        with tempfile.TemporaryDirectory(prefix="delivery-bench-") as tmp:
            summary = run(args, Path(tmp))
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
