"""Number formats shared by the run report (:mod:`hacrl_fed.report.run_report`) and the progress view
(:mod:`hacrl_fed.report.progress`)."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float | None) -> str:
    """``1536`` → ``1.5 KiB``, ``530_000_000`` → ``505 MiB`` (binary units, 2–3 significant digits); None → ``-``."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1000 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 10 else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
