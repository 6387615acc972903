"""PNG plots of a run: commit latency distributions and throughput against writers."""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import Result


def plot(results: list[Result], out_dir: Path, *, smoke: bool, prefix: str = "") -> list[Path]:
    """Draw the plots of `results`. The unprefixed names belong to the complete run in
    latest.*; a partial run passes its stamp as `prefix` so it does not replace them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suffix = "-smoke" if smoke else ""
    paths: list[Path] = []
    send = [r for r in results if r.scenario.startswith("a.")]
    if send:
        fig, ax = plt.subplots(figsize=(8, 5))
        for variant in dict.fromkeys(r.variant for r in send):
            rows = [r for r in send if r.variant == variant]
            ax.plot(
                [r.metrics["writers"] for r in rows],
                [r.metrics["commits/s"] for r in rows],
                marker="o",
                label=variant,
            )
        ax.set_xlabel("concurrent writers")
        ax.set_ylabel("commits/s")
        ax.set_title("Business transaction throughput against concurrent writers")
        ax.legend()
        ax.grid(alpha=0.3)
        path = out_dir / f"{prefix}send-throughput{suffix}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    with_samples = [r for r in results if r.samples]
    if with_samples:
        fig, ax = plt.subplots(figsize=(8, 5))
        for r in with_samples:
            if r.scenario.startswith("a.") and r.metrics.get("writers") != 16:
                continue
            ordered = sorted(r.samples)
            ys = [i / len(ordered) for i in range(1, len(ordered) + 1)]
            ax.plot(ordered, ys, label=f"{r.scenario}: {r.variant}")
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms, log scale)")
        ax.set_ylabel("fraction of samples")
        ax.set_title("Latency distributions (send overhead at 16 writers; end to end)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        path = out_dir / f"{prefix}latency-cdf{suffix}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
    return paths
