"""Log set-up shared by the long-running processes (worker, ServerApp)."""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_FORMAT", "log_to_stdout"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_stdout(level: int = logging.INFO) -> None:
    """Send ``hacrl_fed.*`` records at ``level`` and above to stdout, once per process.

    The supervising command (``hacrl-fed client``/``server``/``simulate``) reads that stream and
    shows the progress lines; records do not propagate to the root logger (Flower configures it).
    """
    logger = logging.getLogger("hacrl_fed")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
