"""A real ``transformers serve`` process (the OpenAI-compatible server that ships with ``transformers``) on a
tiny local model directory, for the rollout-only site and router tests: CPU, 127.0.0.1 only, no hub access.

The launcher is the benchmarks' own (``benchmarks/contributor.py``: :func:`transformers_serve` yields the ``/v1``
base URL once ``/health`` answers and stops the server's process group however the block ends)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from contributor import free_port, transformers_serve  # noqa: E402

__all__ = ["free_port", "transformers_serve"]
