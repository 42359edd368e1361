"""``collab.png`` of the collaboration benchmark: after-training accuracy per recipe and agent (bars, std over
seeds), before training dashed."""

from __future__ import annotations

from pathlib import Path

from collab.recipes import SET_TITLES, eval_sets_of, label


def plot(summary: dict, agents: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = list(summary["recipes"])
    sets = eval_sets_of(summary["meta"])
    fig, axes = plt.subplots(1, len(sets), figsize=(4 + 2.2 * len(recipes), 4), sharey=True, squeeze=False)
    axes = axes[0]
    width = 0.8 / max(1, len(agents))
    for ax, e in zip(axes, sets):
        title = SET_TITLES[e][2]
        for i, a in enumerate(agents):
            xs = [k + i * width for k in range(len(recipes))]
            st = [summary["recipes"][r]["agents"][a][e] for r in recipes]
            ax.bar(xs, [s["mean"] for s in st], width, yerr=[s["std"] for s in st], capsize=3, label=a)
            ax.axhline(summary["before"][a][e], color=f"C{i}", ls="--", lw=1)
        ax.set_xticks([k + width * (len(agents) - 1) / 2 for k in range(len(recipes))],
                      [label(r) for r in recipes], rotation=20, ha="right", fontsize=8)
        ax.set_title(title + " (dashed: before)")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("greedy avg@1")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
