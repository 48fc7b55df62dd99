"""Coordinator overhead: ms per training step under ParameterServerStrategy (chief + 1
worker + 1 ps, all on this machine) against the same step with no strategy, as a
function of the steps packed into one scheduled function (`--steps-per-execution`).

    python -m bench.overhead                   # MLP and CNN, 1, 5, 20 and 100 steps
    python -m bench.overhead --quick

The ParameterServerStrategy coordinator pays a fixed cost per `schedule` call (the RPC
to the worker, the closure queue, fetching the returned values), so the cost per step
falls as 1/steps-packed. The MLP's step is ~2 ms, so it shows the overhead undiluted; the
CNN shows what it means for a real model. Overhead per step = ps ms/step - single ms/step.

Writes bench/results/overhead.json and overhead.png.
"""
from __future__ import annotations

import argparse
import sys

from bench import common

PACKED = (1, 5, 20, 100)
# Steps per run for each steps-packed value: ~10-40 s of steady training each.
STEPS = {"mlp": {1: 800, 5: 2000, 20: 4000, 100: 8000},
         "cnn": {1: 200, 5: 250, 20: 400, 100: 600}}
QUICK = {"mlp": {1: 100, 5: 200, 20: 400, 100: 800},
         "cnn": {1: 30, 5: 40, 20: 80, 100: 300}}


def log_every(steps: int, packed: int) -> int:
    """~20 lines a run, at a multiple of the packed steps (lines come between calls)."""
    every = max(packed, steps // 20)
    return max(packed, every - every % packed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", allow_abbrev=False)
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--packed", default=",".join(map(str, PACKED)),
                   help="comma-separated --steps-per-execution values")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=400)
    p.add_argument("--resummarize", action="store_true",
                   help="recompute the summary and plot from the recorded runs")
    args = p.parse_args(argv)
    if args.resummarize:
        result = common.read_json("overhead")
        models = list(dict.fromkeys(r["model"] for r in result["runs"]))
        packed = sorted({r["steps_per_execution"] for r in result["runs"]})
        result["summary"] = summarize(result["runs"], models, packed)
        common.update_json("overhead", result)
        plot(result["summary"], models)
        return 0
    models = [m for m in args.models.split(",") if m]
    packed = [int(x) for x in args.packed.split(",") if x]
    table = QUICK if args.quick else STEPS

    load_before = common.load_average()
    runs = []
    try:
        for model in models:
            for spe in packed:
                steps = table[model].get(spe) or 20 * spe
                steps -= steps % spe
                every = log_every(steps, spe)
                for setup, workers, ps in (("single", 0, 0), ("ps", 1, 1)):
                    with common.TempJobDir() as job_dir:
                        args_ = common.trainer_args(model, steps, every, args.batch_size,
                                                    job_dir, "--steps-per-execution", str(spe))
                        record = common.measure(f"{model} {setup} steps/execution={spe}",
                                                args_, batch_size=args.batch_size,
                                                workers=workers, ps=ps, timeout=args.timeout)
                    record.update(model=model, setup=setup, steps_per_execution=spe)
                    runs.append(record)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    summary = summarize(runs, models, packed)
    common.write_json("overhead", {"batch_size": args.batch_size, "quick": args.quick,
                                   "summary": summary, "runs": runs}, load_before)
    plot(summary, models)
    for model in models:
        print(f"{model}: {summary[model]['recommendation']}")
    return 0


def summarize(runs: list[dict], models: list[str], packed: list[int]) -> dict:
    out = {}
    for model in models:
        rows = []
        for spe in packed:
            got = {r["setup"]: r for r in runs if r["model"] == model
                   and r["steps_per_execution"] == spe and "ms_per_step" in r}
            if len(got) < 2:
                continue
            single, ps = got["single"]["ms_per_step"], got["ps"]["ms_per_step"]
            rows.append({"steps_per_execution": spe, "single_ms_per_step": single,
                         "ps_ms_per_step": ps,
                         "overhead_ms_per_step": round(ps - single, 3),
                         "overhead_ms_per_scheduled_function": round((ps - single) * spe, 2),
                         "ps_over_single": round(ps / single, 3)})
            if "cpu_ms_per_step" in got["single"] and "cpu_ms_per_step" in got["ps"]:
                # CPU of every replica together: the work distribution adds per step.
                rows[-1].update(single_cpu_ms_per_step=got["single"]["cpu_ms_per_step"],
                                ps_cpu_ms_per_step=got["ps"]["cpu_ms_per_step"])
        out[model] = {"rows": rows, "recommendation": recommend(rows)}
    return out


def recommend(rows: list[dict]) -> str:
    """The smallest packing within 10% of the best measured CPU time per step under ps
    (CPU time, not wall time: the shared machine's load moves wall time by 2x). More
    packing only delays the log lines and the preemption checks between calls.
    Without CPU figures: the smallest packing within 10% of a single-node step."""
    cpu = [r for r in rows if "ps_cpu_ms_per_step" in r]
    if cpu:
        best = min(r["ps_cpu_ms_per_step"] for r in cpu)
        for row in cpu:
            if row["ps_cpu_ms_per_step"] <= 1.10 * best:
                return (f"--steps-per-execution {row['steps_per_execution']}: "
                        f"{row['ps_cpu_ms_per_step']} CPU-ms/step under ps, within 10% of "
                        f"the best measured ({best}); single node "
                        f"{row['single_cpu_ms_per_step']} CPU-ms/step")
    for row in rows:
        if row["ps_over_single"] <= 1.10:
            return (f"--steps-per-execution {row['steps_per_execution']}: ps step is "
                    f"{row['ps_over_single']}x the single-node step")
    if rows:
        best = min(rows, key=lambda r: r["ps_ms_per_step"])
        return (f"--steps-per-execution {best['steps_per_execution']} (fastest measured; "
                f"ps step {best['ps_over_single']}x single-node)")
    return "no complete measurements"


def plot(summary: dict, models: list[str]) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = summary[model]["rows"]
        if not rows:
            continue
        x = [r["steps_per_execution"] for r in rows]
        ax.plot(x, [r["ps_ms_per_step"] for r in rows], "o--", color="#c44e52", alpha=0.45,
                label="ps, wall ms/step (chief + 1 worker + 1 ps)")
        ax.plot(x, [r["single_ms_per_step"] for r in rows], "s--", color="#4c72b0",
                alpha=0.45, label="no strategy, wall ms/step")
        if all("ps_cpu_ms_per_step" in r for r in rows):
            # CPU time of all replicas per step: steady whatever else the machine runs.
            ax.plot(x, [r["ps_cpu_ms_per_step"] for r in rows], "o-", color="#c44e52",
                    label="ps, CPU-ms/step (all replicas)")
            ax.plot(x, [r["single_cpu_ms_per_step"] for r in rows], "s-", color="#4c72b0",
                    label="no strategy, CPU-ms/step")
            for r in rows:
                ax.annotate(f"{r['ps_cpu_ms_per_step'] / r['single_cpu_ms_per_step']:.1f}x",
                            (r["steps_per_execution"], r["ps_cpu_ms_per_step"]),
                            textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7)
        ax.set_xscale("log")
        ax.set_xticks(x)
        ax.set_xticklabels([str(v) for v in x])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("steps packed per scheduled function (--steps-per-execution)")
        ax.set_ylabel("ms per training step (wall, or CPU of all replicas)")
        ax.set_title(f"{model.upper()}, batch 100: coordinator overhead", fontsize=10)
        ax.legend(fontsize=7)
    common.save_figure(fig, "overhead")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
