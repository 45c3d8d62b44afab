"""The rendered timeline of docs/timeline.md, drawn with matplotlib from a real trace file.

    python docs/timeline_figure.py record   # run the collection below: docs/images/timeline.json
    python docs/timeline_figure.py          # draw docs/images/timeline.png from that file

The run: two node collectors of two local workers each (``collector_class="sync"``), CartPole on
node 0 and a CartPole whose steps take 2 ms longer on node 1 (a straggling node), and a policy
of about 2 M parameters pushed after every batch; three rounds traced.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

IMAGES = Path(__file__).resolve().parent / "images"
TRACE, FIGURE = IMAGES / "timeline.json", IMAGES / "timeline.png"
COLORS = {
    "wait": "#b0b0b0", "hand-out": "#2ca02c", "push": "#d62728", "push wait": "#ff9896",
    "idle": "#e0e0e0", "weights": "#d62728", "policy": "#1f77b4", "env": "#17becf", "write": "#9467bd",
}


def record() -> None:
    """Collect four batches (one to warm up, three traced) and write the trace."""
    import gymnasium as gym
    import torch
    from torch import nn

    from rpc_collectors import GymEnv, RPCCollector

    class SlowSteps(gym.Wrapper):
        def step(self, action):
            time.sleep(0.002)
            return self.env.step(action)

    def fast():
        return GymEnv("CartPole-v1")

    def slow():
        return GymEnv(SlowSteps(gym.make("CartPole-v1")))

    class Argmax(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(4, 1024), nn.Tanh(), nn.Linear(1024, 1024), nn.Tanh(), nn.Linear(1024, 2))

        def forward(self, observation: torch.Tensor) -> torch.Tensor:
            return self.net(observation).argmax(-1)

    torch.set_num_threads(1)
    policy = Argmax()
    with RPCCollector([fast, slow], policy, collector_class="sync", num_workers_per_collector=2,
                      frames_per_batch=2 * 2 * 20, launcher="local", rpc_timeout=60) as collector:
        for i, _ in enumerate(collector):
            if i == 0:
                collector.trace(TRACE, rounds=3)
            with torch.no_grad():
                for param in policy.parameters():
                    param.add_(0.01)
            collector.update_policy_weights_()
            if i == 3:
                break


def draw() -> None:
    """One row per thread of each process, its spans as bars, the trainer on top."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = json.loads(TRACE.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    fig, ax = plt.subplots(figsize=(12, 0.45 * len(rows) + 1.4))
    for y, row in enumerate(rows):
        for e in (e for e in spans if (e["pid"], e["tid"]) == row):
            ax.broken_barh([(e["ts"] / 1e3, max(e["dur"] / 1e3, 0.02))], (y - 0.4, 0.8),
                           color=COLORS.get(e["name"], "black"), linewidth=0)
    ax.set_yticks(range(len(rows)), [f"{names[p]} · {threads[p, t]}" for p, t in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the window's first span (the trainer's clock)")
    shown = sorted({e["name"] for e in spans}, key=list(COLORS).index)
    ax.legend(handles=[Patch(color=COLORS[n], label=n) for n in shown], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              fontsize=8, frameon=False)
    ax.set_title("Three sync rounds of two node collectors (node 1 straggles), a weight push after each", fontsize=10)
    fig.tight_layout()
    fig.savefig(FIGURE, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    IMAGES.mkdir(exist_ok=True)
    record() if sys.argv[1:] == ["record"] else draw()
