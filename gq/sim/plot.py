"""Plots of simulated or real runs: a device timeline and a JCT CDF per policy (matplotlib)."""

from __future__ import annotations

from pathlib import Path


def draw(results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        len(results) + 1, 1, figsize=(11, 2.2 * (len(results) + 1)), squeeze=False
    )
    colours = plt.get_cmap("tab20")
    for row, result in enumerate(results):
        axis = axes[row][0]
        for piece in result.slices:
            axis.broken_barh(
                [(piece.start, piece.end - piece.start)],
                (piece.device - 0.4, 0.8),
                color=colours(piece.job % 20),
                linewidth=0,
            )
        axis.set_ylabel(f"{result.policy}\ndevice")
        axis.set_yticks(range(result.gpus))
    cdf = axes[-1][0]
    for result in results:
        jcts = sorted(result.jcts())
        cdf.step(
            jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=result.policy
        )
    cdf.set_xlabel("job completion time (s)")
    cdf.set_ylabel("fraction of jobs")
    cdf.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
