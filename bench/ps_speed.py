"""Parameter-server training: mljob's TensorFlow 2 path beside TensorFlow 1's
between-graph replication (`bench/tf1_baseline.py`), side by side in one run.

    python -m bench.ps_speed                      # MLP and CNN, every setup
    python -m bench.ps_speed --model mlp --quick
    python -m bench.ps_speed --extra="--steps-per-execution 50"   # ours with a lever
    python -m bench.ps_speed --model cnn --repeats 3   # every setup 3 times, interleaved

Setups, each for the MLP (784-100-10) and the CNN, batch 100, periodic evaluation and
checkpoints outside the timed window: mljob single node; mljob chief + 2 workers + 1 ps
step by step (`--no-ps-local-steps`, one read and one update on the ps per step), with
local steps in float32 (each scheduled function trains the worker's copy, one read and
one write per function), with the defaults (local steps, bfloat16 on the wire), and the
defaults with one intra-op thread per replica (`TF_NUM_INTRAOP_THREADS=1`: four
processes share the 2 cores); TF1 master + 2 workers + 1 ps with Adam (the trainer's
optimiser) and with plain SGD. Opt-in, named with --only: single node and the ps
defaults under `--mixed-precision mixed_bfloat16` (for CPUs with bfloat16 arithmetic),
and with oneDNN's bfloat16 math mode for float32 (`TF_SET_ONEDNN_FPMATH_MODE=BF16`).
Test accuracy after the run is recorded for mljob's setups.
Reported: examples/s after warm-up (from the leader's progress lines), CPU-seconds per
example across all replicas, and the ratios the goal is stated in: ours over TF1's, and
ours over our own single node. With --repeats N each repeat runs every setup once, in
turn, so that a drift in the machine's speed touches every setup alike; the ratios are
taken between medians of examples/s, and test accuracy is the mean of the repeats (one
1,000-step CNN run moves by a point or more).

Writes bench/results/ps_speed_<models>.json and .png (ps_speed_mlp_cnn by default).
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys

from bench import common

WORKERS, PS = 2, 1


ONE_THREAD = {"TF_NUM_INTRAOP_THREADS": "1"}  # TensorFlow reads it when it starts
OURS = "mljob ps defaults"  # local steps, bfloat16 on the wire
BF16 = ["--mixed-precision", "mixed_bfloat16"]
# oneDNN computing float32 convolutions and matrix products from bfloat16 inputs, with
# float32 sums, the model and its activations staying float32 (TensorFlow reads it once).
ONEDNN_BF16 = {"TF_SET_ONEDNN_FPMATH_MODE": "BF16"}
OPT_IN = {"mljob single node mixed bfloat16", OURS + " mixed bfloat16",  # only with --only
          OURS + " mixed bfloat16 one intra-op thread", "mljob single node onednn bf16 math",
          OURS + " onednn bf16 math"}


def setups(model: str, steps: int, every: int, batch: int, job_dir: str,
           extra: list[str]) -> list[tuple[str, str, list[str], int, int, dict]]:
    """(label, module, args, workers, ps, env) of every configuration, in run order."""
    # Evaluated once at the end, after the timed window: test accuracy beside speed.
    ours = common.trainer_args(model, steps, every, batch, job_dir, eval_every=steps)
    tf1 = ["--model", model, "--train-steps", str(steps), "--batch-size", str(batch),
           "--log-every", str(every)]
    local = ours + ["--ps-local-steps", "--ps-wire-dtype", "float32"] + extra
    wire16 = ours + ["--ps-local-steps", "--ps-wire-dtype", "bfloat16"] + extra
    return [
        ("mljob single node", "trainer.task", ours, 0, 0, {}),
        ("mljob ps step by step", "trainer.task", ours + ["--no-ps-local-steps"], WORKERS,
         PS, {}),
        ("mljob ps local steps float32", "trainer.task", local, WORKERS, PS, {}),
        (OURS, "trainer.task", wire16, WORKERS, PS, {}),
        (OURS + " one intra-op thread", "trainer.task", wire16, WORKERS, PS, ONE_THREAD),
        # Opt-in, for CPUs with bfloat16 arithmetic (AVX512_BF16, AMX): not in the default run.
        ("mljob single node mixed bfloat16", "trainer.task", ours + BF16, 0, 0, {}),
        (OURS + " mixed bfloat16", "trainer.task", wire16 + BF16, WORKERS, PS, {}),
        (OURS + " mixed bfloat16 one intra-op thread", "trainer.task", wire16 + BF16,
         WORKERS, PS, ONE_THREAD),
        ("mljob single node onednn bf16 math", "trainer.task", ours, 0, 0, ONEDNN_BF16),
        (OURS + " onednn bf16 math", "trainer.task", wire16, WORKERS, PS, ONEDNN_BF16),
        ("tf1 ps adam", "bench.tf1_baseline", tf1 + ["--optimizer", "adam"], WORKERS, PS, {}),
        ("tf1 ps sgd", "bench.tf1_baseline", tf1 + ["--optimizer", "sgd"], WORKERS, PS, {}),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ps_speed", allow_abbrev=False)
    p.add_argument("--model", choices=("mlp", "cnn"), action="append")
    p.add_argument("--train-steps", type=int, default=None,
                   help="default: 3000 for the MLP, 1000 for the CNN")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--extra", default="", help="flags added to mljob's ps run")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in every replica's environment (e.g. TF_NUM_INTRAOP_THREADS=1)")
    p.add_argument("--only", default="", help="comma-separated setup labels to run")
    p.add_argument("--name", default="", help="results file name (default ps_speed_<models>)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every setup this many times, interleaved (default 1)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args(argv)
    models = args.model or ["mlp", "cnn"]
    extra = shlex.split(args.extra)
    env = dict(item.split("=", 1) for item in args.env)
    only = {label.strip() for label in args.only.split(",") if label.strip()}
    load_before = common.load_average()
    runs = []
    try:
        for model in models:
            steps = args.train_steps or (3000 if model == "mlp" else 1000)
            if args.quick:
                steps //= 5
            # Log (and so fetch a result, which waits for that function) rarely enough
            # that several scheduled functions are in flight on the workers at once.
            every = max(100, steps // 10 - (steps // 10) % 20)
            for repeat in range(args.repeats):
                for label, module, targs, workers, ps, own_env in setups(
                        model, steps, every, args.batch_size, "JOB_DIR", extra):
                    if (label not in only) if only else (label in OPT_IN):
                        continue
                    with common.TempJobDir() as job_dir:
                        targs = [job_dir if a == "JOB_DIR" else a for a in targs]
                        record = common.measure(f"{model}: {label}", targs, module=module,
                                                batch_size=args.batch_size, workers=workers,
                                                ps=ps, timeout=args.timeout,
                                                env={**own_env, **env})
                    record.update(model=model, setup=label, train_steps=steps, env=own_env,
                                  repeat=repeat)
                    if record.get("cpu_ms_per_step"):
                        record["cpu_s_per_example"] = round(
                            record["cpu_ms_per_step"] / 1000 / args.batch_size, 7)
                    runs.append(record)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    ratios = summarise(runs)
    # One file per model set: runs do not overwrite.
    name = args.name or "ps_speed_" + "_".join(models)
    common.write_json(name, {"batch_size": args.batch_size, "extra": extra, "env": env,
                             "quick": args.quick, "repeats": args.repeats, "runs": runs,
                             "setups": setups_summary(runs), "ratios": ratios},
                      load_before)
    plot(runs, name)
    for r in runs:
        print(f"{r['label']:28s} {r.get('examples_per_s', 'failed')!s:>10} examples/s  "
              f"{r.get('cpu_s_per_example', '-')} CPU-s/example")
    for model, rows in ratios.items():
        for setup, row in rows.items():
            print(f"{model}: {setup}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    return 0


def setups_summary(runs: list[dict]) -> dict:
    """{model: {setup: median examples/s, mean test accuracy, and each repeat's}}."""
    out: dict = {}
    for r in runs:
        row = out.setdefault(r["model"], {}).setdefault(
            r["setup"], {"examples_per_s": [], "test_accuracy": []})
        if r.get("examples_per_s"):
            row["examples_per_s"].append(r["examples_per_s"])
        if r.get("final_test_accuracy") is not None:
            row["test_accuracy"].append(r["final_test_accuracy"])
    for rows in out.values():
        for row in rows.values():
            if row["examples_per_s"]:
                row["median_examples_per_s"] = round(statistics.median(row["examples_per_s"]))
            if row["test_accuracy"]:
                row["mean_test_accuracy"] = round(statistics.mean(row["test_accuracy"]), 4)
    return out


def summarise(runs: list[dict]) -> dict:
    """Per model, for each of mljob's ps setups: its median examples/s over TF1's (Adam,
    SGD), over our single node computing in the same precision, and over step by step;
    its mean test accuracy in points from step by step's."""
    out = {}
    for model, rows in setups_summary(runs).items():
        rate = {s: v.get("median_examples_per_s") for s, v in rows.items()}
        accuracy = {s: v.get("mean_test_accuracy") for s, v in rows.items()}
        base = accuracy.get("mljob ps step by step")
        out[model] = {}
        for setup in rows:
            ours = rate.get(setup)
            if not setup.startswith("mljob ps") or not ours:
                continue
            single = ("mljob single node mixed bfloat16" if "mixed bfloat16" in setup
                      else "mljob single node")
            row = {}
            for other, name in (("tf1 ps adam", "vs_tf1_adam"), ("tf1 ps sgd", "vs_tf1_sgd"),
                                (single, "vs_own_single_node"),
                                ("mljob single node", "vs_own_single_node_float32"),
                                ("mljob ps step by step", "vs_step_by_step")):
                if rate.get(other) and other != setup:
                    row[name] = round(ours / rate[other], 3)
            if (base is not None and accuracy.get(setup) is not None
                    and setup != "mljob ps step by step"):
                row["accuracy_points_vs_step_by_step"] = round(
                    100 * (accuracy[setup] - base), 2)
            if row:
                out[model][setup] = row
    return out


def plot(runs: list[dict], name: str) -> None:
    """Horizontal bars of median examples/s per setup (whiskers: the repeats' range), one
    panel per model, each bar labelled with its mean test accuracy: single nodes grey,
    mljob's ps setups blue (green: the defaults), TF1 orange."""
    plt = common.pyplot()
    summary = setups_summary(runs)
    rows_max = max(len(rows) for rows in summary.values())
    fig, axes = plt.subplots(1, len(summary), figsize=(9 * len(summary), 0.45 * rows_max + 1.2),
                             squeeze=False)
    for ax, (model, rows) in zip(axes[0], summary.items(), strict=True):
        setups = list(rows)[::-1]
        colors = ["#999" if "single node" in s else "#ff7f0e" if s.startswith("tf1")
                  else "#2ca02c" if s.startswith(OURS) else "#1f77b4" for s in setups]
        values = [rows[s].get("median_examples_per_s", 0) for s in setups]
        spread = [rows[s]["examples_per_s"] or [v] for s, v in zip(setups, values, strict=True)]
        low = [max(0, v - min(each)) for v, each in zip(values, spread, strict=True)]
        high = [max(0, max(each) - v) for v, each in zip(values, spread, strict=True)]
        ax.barh(setups, values, color=colors, xerr=[low, high], capsize=3)
        for y, (setup, value) in enumerate(zip(setups, values, strict=True)):
            accuracy = rows[setup].get("mean_test_accuracy")
            label = f" {value:,.0f}" + (f"  ({100 * accuracy:.1f}%)" if accuracy else "")
            ax.text(value + high[y], y, label, va="center", fontsize=8)
        ax.set_xlim(0, 1.35 * max(values))
        ax.locator_params(axis="x", nbins=4)
        repeats = max(len(v["examples_per_s"]) for v in rows.values())
        ax.set_title(f"{model.upper()}: examples/s"
                     + (f", median of {repeats} (test accuracy: mean)" if repeats > 1 else ""))
    fig.suptitle(f"ps setups: chief + {WORKERS} workers + {PS} ps")
    fig.tight_layout()
    common.save_figure(fig, name)


if __name__ == "__main__":
    sys.exit(main())
