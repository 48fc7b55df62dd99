"""Scaling: examples/s of the CNN for chief + 1, 2, 4 workers with 1 and 2 ps, and
MultiWorkerMirroredStrategy with chief + 1 worker, against the single-node figure.

    python -m bench.scaling                    # measure, then model the network
    python -m bench.scaling --quick
    python -m bench.scaling --model-only       # only the network model (no runs)

On a 2-core machine every replica shares the same two cores, so no speed-up is
possible: what the runs measure is the cost of distribution (RPCs, serialisation,
the coordinator, the replicas competing for cores).

The network model says what N hosts would do. Under ParameterServerStrategy every step
a worker reads every variable from the ps and writes a gradient of the same size back:
2 x weights bytes per step, whatever the steps packed per call (each step reads the
variables anew). The ps side carries every worker's traffic over its links (variables
sharded evenly over P ps), a worker only its own, so the steps/s ceiling is
min(N, P) x link / (2 x weights). Compute gives N x the single-node step rate; the
network becomes the limit past N = P x link / (2 x weights x single-node steps/s).
A ring all-reduce (MultiWorkerMirrored) moves 2 (N-1)/N x weights per worker per step.

Writes bench/results/scaling.json and scaling.png.
"""
from __future__ import annotations

import argparse
import os
import sys

from bench import common

CONFIGS = [  # (label, workers, ps); workers with ps=0 is MultiWorkerMirroredStrategy
    ("single node", 0, 0),
    ("ps: chief + 1 worker + 1 ps", 1, 1),
    ("ps: chief + 2 workers + 1 ps", 2, 1),
    ("ps: chief + 4 workers + 1 ps", 4, 1),
    ("ps: chief + 1 worker + 2 ps", 1, 2),
    ("ps: chief + 2 workers + 2 ps", 2, 2),
    ("ps: chief + 4 workers + 2 ps", 4, 2),
    ("multiworker: chief + 1 worker", 1, 0),
]
LINKS_GBIT = (1, 10, 25)
WORKER_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling", allow_abbrev=False)
    p.add_argument("--model", default="cnn", choices=("cnn", "mlp"))
    p.add_argument("--train-steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--steps-per-execution", type=int, default=None,
                   help="passed to the trainer (default: the trainer's default)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--model-only", action="store_true",
                   help="skip the runs; model the network from the last single-node figure")
    p.add_argument("--timeout", type=float, default=500)
    args = p.parse_args(argv)
    steps = 100 if args.quick else args.train_steps
    spe = args.steps_per_execution
    if spe:
        steps -= steps % spe
    # The trainer ends a packed call at every log step: log at multiples of the
    # packing (the trainer's default is 20), about ten times a run.
    unit = spe or 20
    every = max(unit, steps // 10 - (steps // 10) % unit)

    load_before = common.load_average()
    runs = []
    if args.model_only:
        previous = common.read_json("scaling") or {}
        runs = previous.get("runs", [])
    else:
        try:
            for label, workers, ps in CONFIGS:
                extra = ["--steps-per-execution", str(spe)] if spe else []
                with common.TempJobDir() as job_dir:
                    targs = common.trainer_args(args.model, steps, every, args.batch_size,
                                                job_dir, *extra)
                    record = common.measure(label, targs, batch_size=args.batch_size,
                                            workers=workers, ps=ps, timeout=args.timeout)
                record["strategy"] = "ps" if ps else ("multiworker" if workers else "single")
                runs.append(record)
        except KeyboardInterrupt:
            print("interrupted; every process stopped", file=sys.stderr)
            return 130
    single = next((r for r in runs if r.get("strategy") == "single" and "ms_per_step" in r),
                  None)
    for r in runs:
        if single and "examples_per_s" in r:
            r["relative_to_single"] = round(r["examples_per_s"] / single["examples_per_s"], 3)
    network = network_model(args.model, args.batch_size, host_steps_per_s(single))
    if args.model_only and previous:
        previous.update(runs=runs, network_model=network)
        common.update_json("scaling", previous)
    else:
        common.write_json("scaling", {"model": args.model, "batch_size": args.batch_size,
                                      "train_steps": steps, "quick": args.quick,
                                      "runs": runs, "network_model": network}, load_before)
    plot(runs, network, args.model)
    for r in runs:
        print(f"{r['label']:34s} {r.get('examples_per_s', 'failed')!s:>10} examples/s "
              f"({r.get('relative_to_single', '-')}x single)")
    return 0


def host_steps_per_s(single: dict | None) -> float | None:
    """One idle host's training steps/s: this machine's examples per CPU-second times its
    cores (the shared machine's wall time says more about its load than about the
    trainer); the wall-time figure when no CPU figure was recorded."""
    if not single:
        return None
    if single.get("examples_per_cpu_s"):
        cores = common.machine()["logical_cores"]
        return single["examples_per_cpu_s"] * cores / single.get("batch_size", 100)
    return 1000 / single["ms_per_step"]


def network_model(model: str, batch_size: int, single_steps_per_s: float | None) -> dict:
    """Bytes per step between workers and ps, and the steps/s ceilings they imply."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from trainer import model as models
    weights = models.weights_bytes(model)
    per_step = 2 * weights  # read every variable, write a gradient of every variable
    table = []
    for gbit in LINKS_GBIT:
        link = gbit * 1e9 / 8  # bytes/s, one direction's worth; a full-duplex link
        # carries reads and writes at once, so this is conservative by up to 2x.
        for ps in (1, 2):
            row = {"link_gbit_s": gbit, "ps": ps, "ceiling_steps_per_s": {}, "examples_per_s": {}}
            for n in WORKER_COUNTS:
                net = min(n, ps) * link / per_step
                compute = n * single_steps_per_s if single_steps_per_s else float("inf")
                steps = min(net, compute)
                row["ceiling_steps_per_s"][n] = round(net, 1)
                row["examples_per_s"][n] = round(steps * batch_size)
            if single_steps_per_s:
                row["network_bound_beyond_workers"] = round(ps * link / per_step
                                                            / single_steps_per_s, 1)
            table.append(row)
    allreduce = {}
    for gbit in LINKS_GBIT:
        link = gbit * 1e9 / 8
        allreduce[gbit] = {n: round(link / (2 * (n - 1) / n * weights), 1)
                           for n in WORKER_COUNTS if n > 1}
    return {"model": model, "batch_size": batch_size, "parameters": models.num_parameters(model),
            "weights_bytes": weights, "ps_bytes_per_step": per_step,
            "single_node_steps_per_s_here": round(single_steps_per_s, 2)
            if single_steps_per_s else None,
            "ps_table": table, "allreduce_ceiling_steps_per_s": allreduce}


def plot(runs: list[dict], network: dict, model: str) -> None:
    plt = common.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    done = [r for r in runs if "examples_per_s" in r]
    labels = [r["label"] for r in done]
    # Examples per CPU-second of all replicas together: what distribution costs, steady
    # whatever else the shared machine runs (wall examples/s printed above each bar).
    by_cpu = all(r.get("examples_per_cpu_s") for r in done)
    values = [r["examples_per_cpu_s"] if by_cpu else r["examples_per_s"] for r in done]
    colors = ["#4c72b0" if r["strategy"] == "single" else
              "#c44e52" if r["strategy"] == "ps" else "#55a868" for r in done]
    bars = ax.bar(range(len(done)), values, color=colors)
    for bar, r, v in zip(bars, done, values):
        ax.annotate(f"{v:,.0f} ({v / values[0]:.2f}x)\nwall {r['examples_per_s']:,.0f}/s",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(done)))
    ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("examples per CPU-second, all replicas" if by_cpu
                  else "examples/s (after warm-up)")
    ax.set_title(f"{model.upper()} on one 2-core machine: the cost of distribution",
                 fontsize=10)
    ax.set_ylim(top=max(values or [1]) * 1.2)

    single = network.get("single_node_steps_per_s_here")
    styles = {1: ":", 10: "--", 25: "-"}
    for row in network["ps_table"]:
        n = list(row["examples_per_s"])
        ax2.plot(n, list(row["examples_per_s"].values()), styles[row["link_gbit_s"]],
                 color="#c44e52" if row["ps"] == 1 else "#8172b2", marker="o", markersize=3,
                 label=f"{row['ps']} ps, {row['link_gbit_s']} Gbit/s")
    if single:
        ax2.plot(WORKER_COUNTS, [n * single * network["batch_size"] for n in WORKER_COUNTS], color="grey",
                 linewidth=0.8, label="compute only (N x this machine)")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("workers (one per host)")
    ax2.set_ylabel("modelled examples/s")
    ax2.set_title(f"model: {network['ps_bytes_per_step'] / 1e6:.1f} MB moved per step "
                  f"({network['parameters']:,} float32 parameters x 2)", fontsize=10)
    ax2.legend(fontsize=7)
    common.save_figure(fig, "scaling")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
