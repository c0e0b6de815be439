"""The figures of a validation run (calibrate/validate.py): simulated against real JCT,
per program and per policy mean. matplotlib is imported when a figure is drawn."""
from __future__ import annotations

from pathlib import Path

from agentsim.files import atomic_write
from calibrate.validate_report import CLOCKS

def _axes(size: tuple[float, float]):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=size)


def _finish(fig, ax, path: Path, hi: float, xlabel: str, ylabel: str, title: str, legend_size: int) -> None:
    """The y = x line, labels, and an atomic PNG."""
    import matplotlib.pyplot as plt

    ax.plot([0, hi], [0, hi], "k--", lw=0.8, label="sim = real")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


def plot_programs(path: Path, real: dict, sim: dict) -> None:
    fig, ax = _axes((5, 5))
    hi = 0.0
    for pol in real:
        both = real[pol][0][1].merge(sim[pol][0][CLOCKS // 2].programs[["program_id", "jct"]], on="program_id",
                                     suffixes=("_real", "_sim"))
        ax.scatter(both["jct_real"], both["jct_sim"], label=pol, s=14)
        hi = max(hi, float(both[["jct_real", "jct_sim"]].max().max()))
    _finish(fig, ax, path, hi, "real JCT (s)", "simulated JCT (s), probe-scaled", "per-program JCT, first repeat", 7)


def plot_means(path: Path, shapes: dict[str, dict]) -> None:
    """Simulated against real mean JCT: a point per policy and shape, the y = x line."""
    fig, ax = _axes((5.5, 5))
    hi = 0.0
    for (shape, rep), marker in zip(shapes.items(), "os^v"):
        for pol, r in rep["policies"].items():
            x, y = r["real"]["mean_jct"], r["sim"]["mean_jct"]
            ax.errorbar(x, y, xerr=r["real"]["spread"] * x / 2, fmt=marker, ms=5, capsize=2)
            ax.annotate(pol, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
            hi = max(hi, x, y)
        ax.plot([], [], marker, color="gray", label=shape)
    _finish(fig, ax, path, hi * 1.05, "real vLLM mean JCT (s)  (bar: run-to-run spread)",
            "simulated mean JCT (s), probe-scaled", "ranking fidelity: every policy, two shapes", 8)
