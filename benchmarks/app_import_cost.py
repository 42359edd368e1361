"""What a Flower task process pays before it can run: import CPU seconds and module counts (issue 25 A).

Every number is measured in fresh interpreters (``python -c``; CPU seconds from ``time.process_time``, so
other load on the machine inflates them less than wall time), each the median of ``--repeat`` runs:

* ``import <module>`` alone, for the ClientApp, the ServerApp, the message records and the courier, with
  the heavy packages each ends up holding (torch, transformers, pydantic, the config models);
* the part of that which is the app's own (imported after Flower's task runtime);
* the cost of one task process as Flower 1.42 starts it (``flwr-clientapp`` / ``flwr-serverapp``: the
  entry module, then the app), against one forked from the warm executor (:mod:`hacrl_fed.flower.executor`),
  whose parent has imported both: the child's own CPU until it is ready to run its handler.

``python benchmarks/app_import_cost.py [--repeat 5] [--out benchmarks/results/app-import-cost/results.md]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "transformers", "pydantic", "hacrl_fed.config", "datasets", "numpy", "grpc")
APPS = {"ClientApp": "hacrl_fed.flower.client_app", "ServerApp": "hacrl_fed.flower.server_app",
        "records": "hacrl_fed.flower.records", "courier": "hacrl_fed.site.courier"}
ENTRY = {"ClientApp": "flwr.supernode.cli", "ServerApp": "flwr.superlink.cli.flwr_serverapp"}

_IMPORT = """
import json, sys, time
pre = sys.argv[1:-1]
for m in pre: __import__(m)
n, t = len(sys.modules), time.process_time()
__import__(sys.argv[-1])
print(json.dumps({"cpu_s": time.process_time() - t, "modules": len(sys.modules) - n,
                  "total_cpu_s": time.process_time(), "heavy": [h for h in %r if h in sys.modules]}))
""" % (HEAVY,)

_FORK = """
import json, os, sys, time
for m in sys.argv[1:]: __import__(m)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    for m in sys.argv[1:]: __import__(m)  # what the task will look up: already in sys.modules
    os.write(w, json.dumps({"cpu_s": time.process_time()}).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 4096).decode())
"""


def _run(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def measure(repeat: int) -> list[str]:
    """Rows of the results table (markdown)."""
    rows = ["| what | CPU s (median) | modules | heavy packages loaded |", "|---|---:|---:|---|"]
    for name, module in APPS.items():
        runs = [_run(_IMPORT, module) for _ in range(repeat)]
        rows.append(f"| `import {module}` ({name}) | {_median(runs, 'cpu_s'):.2f} | {runs[0]['modules']} | "
                    f"{', '.join(runs[0]['heavy']) or '-'} |")
    for name in ENTRY:
        runs = [_run(_IMPORT, ENTRY[name], APPS[name]) for _ in range(repeat)]
        rows.append(f"| {name} module after Flower's task runtime (the app's own part) | "
                    f"{_median(runs, 'cpu_s'):.3f} | {runs[0]['modules']} | - |")
    for name in ENTRY:
        cold = [_run(_IMPORT, ENTRY[name], APPS[name]) for _ in range(repeat)]
        warm = [_run(_FORK, ENTRY[name], APPS[name]) for _ in range(repeat)]
        rows.append(f"| {name} task process, Flower's launcher: a new interpreter imports `{ENTRY[name]}` (all before "
                    f"its first heartbeat), then the app | {_median(cold, 'total_cpu_s'):.2f} | - | - |")
        rows.append(f"| {name} task process, forked by the warm executor | {_median(warm, 'cpu_s'):.3f} | 0 | - |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    rows = measure(args.repeat)
    text = "\n".join(rows)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        args.out.write_text(f"`python benchmarks/app_import_cost.py --repeat {args.repeat}` ({os.cpu_count()} CPUs, "
                            f"load average {load} at the end: other load inflates CPU seconds too)\n\n{text}\n",
                            encoding="utf-8")


if __name__ == "__main__":
    main()
