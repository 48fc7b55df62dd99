"""Peak resident memory of each replica type (single node, chief, worker, ps, and the
Keras baseline), gathered from every run the other benchmarks recorded.

    python -m bench.memory

Every run samples each replica's RSS (the process and its children, every 0.2 s) and
the kernel's high-water mark (VmHWM) of the process, and keeps the larger; this
collects them by replica type and model, so nothing is run twice. Run it after the
other benchmarks. Writes bench/results/memory.json and memory.png.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

from bench import common

KINDS = ("single", "baseline", "chief", "worker", "ps")
OURS = ("throughput", "overhead", "scaling", "time_to_accuracy")


def replica_kind(name: str) -> str:
    return re.sub(r"-[0-9]+$", "", name)


def collect() -> list[dict]:
    """(benchmark, run label, model, replica, kind, MiB) for every recorded replica."""
    rows = []
    for path in sorted(glob.glob(os.path.join(common.RESULTS, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        if not name.startswith(OURS):  # startup/predict results are measured elsewhere
            continue
        with open(path) as f:
            result = json.load(f)
        runs = result.get("runs") or [result]
        for run in runs:
            model = run.get("model") or result.get("model")
            label = run.get("label") or run.get("setup") or name
            for replica, mib in (run.get("peak_rss_mib") or {}).items():
                rows.append({"benchmark": name, "run": label, "model": model,
                             "replica": replica, "kind": replica_kind(replica), "mib": mib})
    return rows


def summarize(rows: list[dict]) -> dict:
    out = {}
    for model in sorted({r["model"] for r in rows if r["model"]}):
        per_kind = {}
        for kind in KINDS:
            values = sorted(r["mib"] for r in rows if r["model"] == model and r["kind"] == kind)
            if values:
                per_kind[kind] = {"max_mib": values[-1], "median_mib": values[len(values) // 2],
                                  "runs": len(values)}
        out[model] = per_kind
    return out


def main(argv=None) -> int:
    argparse.ArgumentParser(prog="python -m bench.memory", description=(
        "Peak resident memory by replica type, from the runs the other benchmarks "
        "recorded; writes bench/results/memory.json and memory.png")).parse_args(argv)
    rows = collect()
    if not rows:
        print("no results yet; run the other benchmarks first", file=sys.stderr)
        return 1
    summary = summarize(rows)
    common.write_json("memory", {"summary": summary, "replicas": rows},
                      common.load_average())
    plt = common.pyplot()
    models = list(summary)
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        kinds = list(summary[model])
        peaks = [summary[model][k]["max_mib"] for k in kinds]
        medians = [summary[model][k]["median_mib"] for k in kinds]
        x = range(len(kinds))
        ax.bar([i - 0.2 for i in x], medians, width=0.4, color="#4c72b0", label="median")
        ax.bar([i + 0.2 for i in x], peaks, width=0.4, color="#dd8452", label="max")
        for i, v in zip(x, peaks):
            ax.annotate(f"{v:,.0f}", (i + 0.2, v), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x))
        ax.set_xticklabels(kinds)
        ax.set_ylabel("peak RSS per process (MiB)")
        ax.set_title(f"{model.upper()}: peak resident memory by replica type", fontsize=10)
        ax.legend(fontsize=8)
    common.save_figure(fig, "memory")
    plt.close(fig)
    for model, kinds in summary.items():
        print(model, ", ".join(f"{k} {v['max_mib']:.0f} MiB" for k, v in kinds.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
