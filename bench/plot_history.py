#!/usr/bin/env python3
"""Issue 35's plots, from the raw results of bench/history.py and bench/events_retention.py.

    python bench/plot_history.py [--history bench/results/history.json]
                                 [--events bench/results/events_retention.json]
                                 [--steady bench/results/hot_steady.json ...]

Writes docs/bench/history-cpu.png (claim + finish PostgreSQL CPU per job against
history size: the partitioned layout, the layout before V0036, no history),
docs/bench/history-hot-size.png (the claim's table against history size) and
docs/bench/history-retention.png (seconds and WAL of retention by dropping
partitions against the batched DELETE, runs and events) and, from
bench/hot_steady.py's results (one or more runs: a naptime each),
docs/bench/history-steady.png (the claim's table as N jobs pass through it).
Needs matplotlib (the bench extra)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PLOTS = ROOT / "docs" / "bench"
MIB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--history", type=Path, default=ROOT / "bench" / "results" / "history.json")
    ap.add_argument("--events", type=Path, default=ROOT / "bench" / "results" / "events_retention.json")
    ap.add_argument("--steady", type=Path, nargs="*", default=[ROOT / "bench" / "results" / "hot_steady.json"])
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist: dict[str, Any] = json.loads(args.history.read_text())
    events: dict[str, Any] = json.loads(args.events.read_text())
    PLOTS.mkdir(parents=True, exist_ok=True)
    pts = hist["points"]
    labels = [f"{p['history']:,}" for p in pts]

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        fig.savefig(PLOTS / f"history-{name}.png", dpi=72)
        plt.close(fig)
        print(PLOTS / f"history-{name}.png")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for side, name in (("sb", "Switchboard (V0036)"), ("old", "layout before V0036 (plain SQL)"),
                       ("plain", "no history (plain SQL)")):
        ax.plot(labels, [p["claim_finish"][side]["pg_cpu_us_per_job"] for p in pts], marker="o", label=name)
    ax.set_xlabel("finished runs of history")
    ax.set_ylabel("PostgreSQL µs per job")
    ax.set_title("claim + finish, CPU per job (4 pgbench clients)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    save(fig, "cpu")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(labels, [p["sizes_after"]["task_runs_hot"]["total_bytes"] / MIB for p in pts], marker="o",
            label="task_runs_hot (V0036)")
    ax.plot(labels, [p["sizes_after"]["bench_old"]["total_bytes"] / MIB for p in pts], marker="s",
            label="one table, as before V0036")
    ax.set_xlabel("finished runs of history")
    ax.set_ylabel("MiB, heap + indexes")
    ax.set_title("The claim's table as history grows")
    ax.legend(fontsize=7)
    save(fig, "hot-size")

    r = hist["retention"]
    ev_drop = events["rounds"][0]["drop"]
    ev_rows = events["rounds"][0]["rows"]
    groups = [(f"{r['rows']:,} runs", r["sb_drop_partitions"]["seconds"], r["old_batched_delete"]["seconds"],
               r["sb_drop_partitions"]["wal_bytes"], r["old_batched_delete"]["wal_bytes"]),
              (f"{events['events']:,} events", ev_drop["reap_s"], ev_rows["reap_s"],
               ev_drop["reap_wal_bytes"], ev_rows["reap_wal_bytes"])]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(7, 3.2))
    x = range(len(groups))
    a1.bar([i - 0.2 for i in x], [g[1] for g in groups], 0.4, label="drop partitions")
    a1.bar([i + 0.2 for i in x], [g[2] for g in groups], 0.4, label="batched DELETE")
    a1.set_xticks(list(x), [g[0] for g in groups])
    a1.set_ylabel("seconds")
    a1.set_title("Retention: time")
    a1.legend(fontsize=7)
    a2.bar([i - 0.2 for i in x], [g[3] / MIB for g in groups], 0.4, label="drop partitions")
    a2.bar([i + 0.2 for i in x], [g[4] / MIB for g in groups], 0.4, label="batched DELETE")
    a2.set_xticks(list(x), [g[0] for g in groups])
    a2.set_yscale("log")
    a2.set_ylabel("MiB of WAL (log)")
    a2.set_title("Retention: WAL")
    save(fig, "retention")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for path in args.steady:
        run: dict[str, Any] = json.loads(path.read_text())
        nap = run.get("autovacuum_naptime", "1min")
        for side, name in (("sb", f"task_runs_hot (V0036), naptime {nap}"),
                           ("old", f"one table, as before V0036, naptime {nap}")):
            if side in run["sides"]:
                sm = [x for x in run["sides"][side]["samples"] if x["jobs"] > 0]
                ax.plot([x["jobs"] / 1e6 for x in sm], [x["total_bytes"] / MIB for x in sm],
                        marker="." if side == "sb" else "s", markersize=3, label=name)
    ax.set_xlabel("jobs through the claim's table (millions)")
    ax.set_ylabel("MiB, heap + indexes")
    ax.set_yscale("log")
    ax.set_title("The claim's table at steady state (autovacuum on)")
    ax.legend(fontsize=7)
    save(fig, "steady")


if __name__ == "__main__":
    main()
