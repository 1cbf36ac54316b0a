"""The latency-energy plot of a mapping search: the Pareto front, each level's best, the choice.

Drawn by ``fusekit accel explore --plot`` and by the report's accel section, so the two show
the same picture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusekit.accel.mapping import Fusion

if TYPE_CHECKING:
    from fusekit.accel.search import Scored

#: Marker and colour of each fusion level in the Pareto plot.
_STYLE = {
    Fusion.UNFUSED: ("o", "tab:blue"),
    Fusion.FUSED_GB: ("s", "tab:orange"),
    Fusion.FUSED_CLUSTER: ("^", "tab:green"),
}


def draw_pareto(
    title: str, front: tuple[Scored, ...], bests: dict[Fusion, Scored], chosen: Scored
) -> Any:
    """Latency against energy: the Pareto front, each level's best, the chosen mapping marked.

    Args:
        title: the axes' title (empty for none).
        front: the latency-energy Pareto front, by latency.
        bests: each fusion level's best-latency mapping (those off the front drawn hollow).
        chosen: the mapping reported, starred and annotated with its label.

    Returns:
        The matplotlib figure; its legend lists only series that have a point.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    lat = [s.latency_cycles for s in front]
    ax.step(lat, [s.energy_pj / 1e6 for s in front], where="post", color="0.7", lw=1, zorder=1)
    for fusion, (marker, colour) in _STYLE.items():
        on = [s for s in front if s.mapping.fusion is fusion]
        if on:
            ax.scatter(
                [s.latency_cycles for s in on],
                [s.energy_pj / 1e6 for s in on],
                marker=marker,
                color=colour,
                zorder=2,
                label=f"{fusion.value}, on the front",
            )
        best = bests.get(fusion)
        if best is not None and best not in front:
            ax.scatter(
                [best.latency_cycles],
                [best.energy_pj / 1e6],
                marker=marker,
                zorder=2,
                facecolors="none",
                edgecolors=colour,
                label=f"{fusion.value}, best latency",
            )
    ax.scatter(
        [chosen.latency_cycles],
        [chosen.energy_pj / 1e6],
        marker="*",
        s=260,
        color="gold",
        edgecolors="black",
        zorder=3,
        label="chosen mapping",
    )
    ax.annotate(
        f"chosen: {chosen.mapping.label()}\n{chosen.latency_cycles:,.0f} cycles, "
        f"{chosen.energy_pj / 1e6:,.1f} uJ",
        (chosen.latency_cycles, chosen.energy_pj / 1e6),
        xytext=(18, 14), textcoords="offset points", fontsize=8,
        bbox={"boxstyle": "round", "fc": "white", "ec": "0.6"},
        arrowprops={"arrowstyle": "->", "color": "0.3"},
    )  # fmt: skip
    ax.set_xlabel("latency (cycles)")
    ax.set_ylabel("energy (uJ)")
    ax.margins(x=0.08, y=0.15)
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
