"""The files of ``route eval``: ``route.json`` (everything :func:`~hacrl_fed.route.evaluate.compare` returns),
``route.md`` (the table) and ``route.png`` (accuracy against cost, one point per policy, the ``cost_aware``
sweep as a line), all written atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hacrl_fed.atomic import atomic_write_bytes, atomic_write_text

__all__ = ["format_table", "shown_policies", "write_report"]

COST_LABEL = {"param_tokens": "params × tokens", "tokens": "tokens", "seconds": "seconds"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def shown_policies(result: dict[str, Any]) -> list[str]:
    """The table's rows: the fixed policies, then ``cost_aware`` at the calibration-chosen τ and at the cheapest τ
    that matches ``best_single`` on the routed queries (when they exist)."""
    fixed = [p for p in ("best_single", "best_per_task", "best_per_task (report)", "knn", "random", "oracle")
             if p in result["policies"]]
    extra = []
    for key in ("calibration_target", "cheapest_matching_target"):
        t = result["match"].get(key)
        if t is not None and f"cost_aware@{t:.2f}" not in extra:
            extra.append(f"cost_aware@{t:.2f}")
    return fixed + extra


def format_table(result: dict[str, Any]) -> str:
    """The Markdown table of ``route.md`` (also what ``route eval`` prints)."""
    kind = result["cost_kind"]
    pol = result["policies"]
    ref = pol["best_single"]["cost"][kind] or 1.0
    head = ["policy", "accuracy % [95 % CI]", "vs best single, pt [95 % CI]",
            f"cost ({COST_LABEL[kind]}) vs best single", "s / query", "tokens / query",
            *(f"→ {m}" for m in result["models"])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in shown_policies(result):
        r = pol[name]
        lo, hi = r["accuracy_ci"]
        vs = "-" if name == "best_single" else (f"{100 * r['vs_best_single']:+.1f} "
                                                 f"[{100 * r['vs_best_single_ci'][0]:+.1f}, "
                                                 f"{100 * r['vs_best_single_ci'][1]:+.1f}]")
        cells = [name, f"{_pct(r['accuracy'])} [{_pct(lo)}, {_pct(hi)}]", vs, f"{r['cost'][kind] / ref:.2f}×",
                 f"{r['cost'].get('seconds', 0.0):.2f}", f"{r['cost'].get('tokens', 0.0):.1f}",
                 *(f"{100 * r['share'][m]:.0f} %" for m in result["models"])]
        lines.append("| " + " | ".join(cells) + " |")
    m = result["match"]
    notes = [f"{result['queries']} routed queries, {result['calibration_queries']} calibration queries, k = {result['k']}."]
    if m.get("cheapest_matching_target") is not None:
        notes.append(f"The router matches best single ({_pct(m['best_single_accuracy'])} %) at "
                     f"{m['cheapest_matching_cost'] / ref:.2f}× its cost (cost_aware@{m['cheapest_matching_target']:.2f},"
                     f" τ chosen on the routed queries: optimistic).")
    else:
        notes.append(f"No cost_aware τ reaches best single's {_pct(m['best_single_accuracy'])} % on the routed queries.")
    if m.get("calibration_target") is not None:
        notes.append(f"τ chosen on calibration alone: {m['calibration_target']:.2f} → "
                     f"{_pct(m['calibration_target_accuracy'])} % at {m['calibration_target_cost'] / ref:.2f}× cost.")
    return "\n".join(lines) + "\n\n" + " ".join(notes) + "\n"


def _plot_png(result: dict[str, Any]) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = result["cost_kind"]
    ref = result["policies"]["best_single"]["cost"][kind] or 1.0
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    sweep = result["cost_aware"]
    ax.plot([s["cost"][kind] / ref for s in sweep], [100 * s["accuracy"] for s in sweep], "-", color="0.6",
            label="cost_aware@τ")
    for name in shown_policies(result):
        r = result["policies"][name]
        lo, hi = r["accuracy_ci"]
        x, y = r["cost"][kind] / ref, 100 * r["accuracy"]
        ax.errorbar([x], [y], yerr=[[y - 100 * lo], [100 * hi - y]], fmt="o", capsize=3)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xlabel(f"cost per query ({COST_LABEL[kind]}), relative to best single")
    ax.set_ylabel("accuracy on routed queries (%)")
    ax.set_title(f"Routing {len(result['models'])} models on {result['queries']} queries")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def _jsonable(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def write_report(result: dict[str, Any], out: str | Path) -> dict[str, Path]:
    """Write ``route.json`` / ``route.md`` / ``route.png`` under ``out``; returns their paths."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"json": d / "route.json", "md": d / "route.md", "png": d / "route.png"}
    atomic_write_text(paths["json"], json.dumps(_jsonable(result), indent=1))
    atomic_write_text(paths["md"], "# Routing policies\n\n" + format_table(result))
    atomic_write_bytes(paths["png"], _plot_png(result))
    return paths
