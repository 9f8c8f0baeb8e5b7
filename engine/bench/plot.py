"""A PNG of step time and collectives against the micro-batch count, one line per FSDP version and sync mode."""

from __future__ import annotations

from pathlib import Path

from ..train.report import pyplot


def plot_grad_accum(result: dict, path: Path, figures: Path | None = None) -> bool:
    """Whether it drew (not without matplotlib: a one-line note says so and where the figures are)."""
    plt = pyplot("plot", figures or "the printed table")
    if plt is None:
        return False
    scenario = result["scenarios"]["grad_accum"]
    fig, (time_ax, gather_ax, scatter_ax) = plt.subplots(1, 3, figsize=(15, 4.5))
    for version in (k for k in scenario if k.startswith("fsdp")):
        rows = scenario[version]["micro_batches"]
        counts = sorted(rows, key=int)
        for mode in rows[counts[0]]:
            label = f"{version.upper()} {mode}"
            xs = [int(c) for c in counts]
            # FSDP1 dashed with larger hollow markers, so equal counts of both versions stay visible
            style = {"linestyle": "-", "marker": "o"} if version == "fsdp2" else {
                "linestyle": "--", "marker": "s", "markersize": 9, "fillstyle": "none"}
            time_ax.plot(xs, [rows[c][mode]["median_ms"] for c in counts], label=label, **style)
            gather_ax.plot(xs, [rows[c][mode]["collectives"]["all_gather"] for c in counts], label=label, **style)
            scatter_ax.plot(xs, [rows[c][mode]["collectives"]["reduce_scatter"] for c in counts], label=label,
                            **style)
    for ax, title in ((time_ax, "step time (median ms)"), (gather_ax, "all-gathers per step"),
                      (scatter_ax, "reduce-scatters per step")):
        ax.set_xlabel("micro-batches per step")
        ax.set_title(title)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(alpha=0.3)
    time_ax.legend(fontsize=8)
    fig.suptitle(f"accel-bench gradient accumulation: backend {result['backend']}, {result['world_size']} rank(s)"
                 " (times from a shared machine: compare lines, not absolute values)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
