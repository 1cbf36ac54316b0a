"""The latency-energy plot of a mapping search: every tiling, the Pareto front, the choice.

Drawn by ``fusekit accel explore --plot`` and by the report's accel section, so the two show
the same picture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fusekit.accel.comet.space import label

if TYPE_CHECKING:
    from fusekit.accel.mapper import Exploration


def _wrap(parts: tuple[str, ...], width: int = 100) -> str:
    """``a -> b -> c`` broken into lines of at most ``width`` characters."""
    lines, line = [], ""
    for p in parts:
        piece = p if not line else f"{line} -> {p}"
        if line and len(piece) > width:
            lines.append(line + " ->")
            line = p
        else:
            line = piece
    return "\n".join([*lines, line])


def draw_pareto(title: str, ex: Exploration) -> Any:
    """Cycles against energy of every accepted tiling; the front, the chosen and the baseline.

    Args:
        title: the first line of the title (the op chain, :attr:`Exploration.chain`, follows).
        ex: the search (its ``front`` empty when pruned: then only the scored tilings show).

    Returns:
        The matplotlib figure; its legend lists only series that have a point.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 4.4))
    ok = [s for s in ex.result.scored if s.total_cycles is not None]
    ax.scatter([s.total_cycles or 0 for s in ok], [(s.total_energy_pj or 0) / 1e6 for s in ok],
               s=8, color="0.75", zorder=1, label=f"accepted tilings ({len(ok)})")  # fmt: skip
    if ex.front:
        xs = [s.total_cycles or 0 for s in ex.front]
        ys = [(s.total_energy_pj or 0) / 1e6 for s in ex.front]
        ax.step(xs, ys, where="post", color="tab:orange", lw=1, zorder=2)
        ax.scatter(xs, ys, marker="s", s=22, color="tab:orange", zorder=3,
                   label=f"Pareto front ({len(ex.front)})")  # fmt: skip
    best = ex.best
    if ex.unfused_cycles is not None and ex.unfused_energy_pj is not None:
        ax.scatter([ex.unfused_cycles], [ex.unfused_energy_pj / 1e6], marker="o", s=70,
                   facecolors="none", edgecolors="tab:blue", zorder=3,
                   label="unfused, same tiling (COMET's construction)")  # fmt: skip
        ax.annotate(f"{ex.speedup:.2f}x cycles, {ex.energy_ratio:.2f}x energy",
                    (ex.unfused_cycles, ex.unfused_energy_pj / 1e6), xytext=(8, -14),
                    textcoords="offset points", fontsize=7, color="tab:blue")  # fmt: skip
    ax.scatter([best.total_cycles or 0], [(best.total_energy_pj or 0) / 1e6], marker="*", s=260,
               color="gold", edgecolors="black", zorder=4,
               label=f"chosen (best {ex.objective})")  # fmt: skip
    ax.annotate(
        f"chosen: {label(best.tiling)}\n{best.total_cycles:,} cycles, "
        f"{(best.total_energy_pj or 0) / 1e6:,.2f} uJ",
        (best.total_cycles or 0, (best.total_energy_pj or 0) / 1e6),
        xytext=(18, 14), textcoords="offset points", fontsize=7,
        bbox={"boxstyle": "round", "fc": "white", "ec": "0.6"},
        arrowprops={"arrowstyle": "->", "color": "0.3"},
    )  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("latency (cycles)")
    ax.set_ylabel("energy (uJ)")
    ax.margins(x=0.08, y=0.15)
    ax.grid(alpha=0.3)
    ax.set_title(f"{title}\n{_wrap(ex.chain)}" if title else _wrap(ex.chain), fontsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig
