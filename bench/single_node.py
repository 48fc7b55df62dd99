"""The single node against TensorFlow 1's graph design and against the machine's
arithmetic ceiling, side by side in one run.

    python -m bench.single_node                    # CNN, 3 interleaved repeats
    python -m bench.single_node --repeats 2 --steps 300
    python -m bench.single_node --only "mljob (defaults),tf1 single"

Each repeat runs, one after the other: the matmul ceiling (float32 and bfloat16),
then every configuration below, each a fresh process on the CNN at batch 100:

| configuration | what runs |
|---|---|
| mljob (defaults) | `trainer.task`: `--mixed-precision auto` (bfloat16 here where the CPU has it) |
| mljob float32 | `trainer.task --mixed-precision off` |
| mljob inter-op 1 | the defaults with TF_NUM_INTEROP_THREADS=1 |
| mljob XLA | the defaults with TF_XLA_FLAGS=--tf_xla_auto_jit=2 (XLA on every cluster) |
| mljob oneDNN | the defaults with TF_ENABLE_ONEDNN_OPTS=1 (oneDNN's kernels) |
| mljob oneDNN off | the defaults with TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's Eigen kernels) |
| tf1 single | `bench.tf1_baseline --model cnn` (TF1's graph, `session.run` a step) |
| tf1 oneDNN | the same with TF_ENABLE_ONEDNN_OPTS=1 |

TensorFlow turns oneDNN on by itself on Linux only where the CPU has AVX512_VNNI,
AVX512_BF16, AVX_VNNI or AMX; TF_ENABLE_ONEDNN_OPTS decides otherwise.

**Fraction of the ceiling**: training FLOPs per example (three times the forward pass's
multiply-adds x 2 of the convolutions and dense layers, counted from the model's
shapes: 83.3 MFLOP for the CNN) x examples/s, over the GFLOP/s of TensorFlow's own
matmul (4096 x 4096, 2 threads) in the precision the configuration computes in, measured
in the same repeat, with TensorFlow's own kernels and with oneDNN's: the faster of the
two is the ceiling. On a loaded machine both move with the load, so the ratio is what
to read; the CPU-time form (FLOPs per CPU-second of the trainer over FLOPs per
CPU-second of the matmul) is kept beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench import common

BATCH = 100
# Training FLOPs of one CNN example (flops_per_example("cnn"), without building it).
CNN_FLOPS = 83_303_424
CONFIGS = {
    "mljob (defaults)": ("trainer.task", [], {}, "auto"),
    "mljob float32": ("trainer.task", ["--mixed-precision", "off"], {}, "float32"),
    "mljob inter-op 1": ("trainer.task", [], {"TF_NUM_INTEROP_THREADS": "1"}, "auto"),
    "mljob XLA": ("trainer.task", [], {"TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}, "auto"),
    "mljob oneDNN": ("trainer.task", [], {"TF_ENABLE_ONEDNN_OPTS": "1"}, "auto"),
    "mljob oneDNN off": ("trainer.task", [], {"TF_ENABLE_ONEDNN_OPTS": "0"}, "auto"),
    "tf1 single": ("bench.tf1_baseline", [], {}, "float32"),
    "tf1 oneDNN": ("bench.tf1_baseline", [], {"TF_ENABLE_ONEDNN_OPTS": "1"}, "float32"),
}
DEFAULT_CONFIGS = ("mljob (defaults)", "mljob float32", "mljob inter-op 1", "mljob XLA",
                   "mljob oneDNN off", "tf1 single", "tf1 oneDNN")

MATMUL = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
out = {}
for name in ("float32", "bfloat16"):
    dtype = getattr(tf, name)
    n = 4096
    a = tf.cast(tf.random.uniform([n, n]), dtype)
    b = tf.cast(tf.random.uniform([n, n]), dtype)
    f = tf.function(lambda a, b: tf.matmul(a, b))
    f(a, b).numpy()
    runs, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < float(sys.argv[1]):
        f(a, b).numpy()
        runs += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    flops = 2 * n ** 3 * runs
    out[name] = {"gflop_per_s": flops / wall / 1e9, "gflop_per_cpu_s": flops / cpu / 1e9}
print(json.dumps(out))
"""


def flops_per_example(model: str = "cnn") -> float:
    """Training FLOPs of one example: 3 x the forward pass's 2 x multiply-adds of the
    convolutions and dense layers (forward, the input's gradient, the weights')."""
    import keras

    from trainer import model as models
    net = models.build(model)
    macs = 0
    for layer in net.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, h, w, c = layer.output.shape
            kh, kw = layer.kernel_size
            macs += h * w * c * kh * kw * layer.input.shape[-1]
        elif isinstance(layer, keras.layers.Dense):
            macs += layer.input.shape[-1] * layer.units
    return 3 * 2 * macs


def ceiling(seconds: float) -> dict:
    """TensorFlow's matmul GFLOP/s per precision: the faster of its own kernels and
    oneDNN's (each also kept, under `kernels`)."""
    kernels = {name: _matmul(seconds, flag) for name, flag in (("eigen", "0"),
                                                               ("onednn", "1"))}
    best = {precision: max((k[precision] for k in kernels.values()),
                           key=lambda v: v["gflop_per_s"])
            for precision in kernels["eigen"]}
    return {**best, "kernels": kernels}


def _matmul(seconds: float, onednn: str) -> dict:
    out = subprocess.run([sys.executable, "-c", MATMUL, str(seconds)], capture_output=True,
                         text=True, timeout=600, cwd=common.ROOT,
                         env={**os.environ, **common.REPLICA_ENV,
                              "TF_ENABLE_ONEDNN_OPTS": onednn})
    if out.returncode != 0:
        raise SystemExit(f"the matmul ceiling failed: {out.stderr[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.single_node", allow_abbrev=False)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--only", default=",".join(DEFAULT_CONFIGS),
                   help=f"comma-separated, of: {', '.join(CONFIGS)}")
    p.add_argument("--matmul-seconds", type=float, default=4.0)
    p.add_argument("--name", default="single_node")
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args(argv)
    labels = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in labels if s not in CONFIGS]
    if bad:
        p.error(f"unknown configuration {', '.join(bad)}; of {', '.join(CONFIGS)}")
    per_example = flops_per_example("cnn")
    from mljob.training import precision
    auto = "bfloat16" if precision.resolve("auto").policy == precision.BFLOAT16 \
        else "float32"
    load_before = common.load_average()
    runs: list[dict] = []
    try:
        for repeat in range(args.repeats):
            load = common.load_average()
            top = ceiling(args.matmul_seconds)
            print(f"== matmul ceiling (load {load}): " + ", ".join(
                f"{k} {v['gflop_per_s']:.0f} GFLOP/s" for k, v in top.items()
                if k != "kernels"), flush=True)
            runs.append({"repeat": repeat, "label": "matmul ceiling", "load_average": load,
                         **top})
            for label in labels:
                module, extra, env, computes = CONFIGS[label]
                computes = auto if computes == "auto" else computes
                with common.TempJobDir() as job_dir:
                    targs = common.trainer_args("cnn", args.steps, 50, BATCH, job_dir,
                                                "--seed", "1", *extra)
                    if module != "trainer.task":
                        targs = ["--model", "cnn", "--train-steps", str(args.steps),
                                 "--batch-size", str(BATCH), "--log-every", "50"]
                    record = common.measure(f"cnn: {label}", targs, batch_size=BATCH,
                                            module=module, env=env,
                                            timeout=args.timeout)
                record.update(repeat=repeat, computes=computes, config=label)
                if "examples_per_s" in record:
                    gflops = per_example * record["examples_per_s"] / 1e9
                    record["gflop_per_s"] = round(gflops, 1)
                    record["fraction_of_ceiling"] = round(
                        gflops / top[computes]["gflop_per_s"], 3)
                    if record.get("examples_per_cpu_s"):
                        record["fraction_of_ceiling_cpu"] = round(
                            per_example * record["examples_per_cpu_s"] / 1e9
                            / top[computes]["gflop_per_cpu_s"], 3)
                    print(f"   {gflops:.0f} GFLOP/s, {record['fraction_of_ceiling']:.0%} of "
                          f"the {computes} ceiling", flush=True)
                runs.append(record)
                common.write_json(args.name, {"flops_per_example": per_example,
                                              "auto_computes": auto, "runs": runs,
                                              "summary": summarize(runs)}, load_before)
    except KeyboardInterrupt:
        print("interrupted; every process stopped", file=sys.stderr)
        return 130
    print(json.dumps(summarize(runs), indent=1))
    return 0


def summarize(runs: list[dict]) -> dict:
    """Medians per configuration, and each configuration over tf1 single within the
    same repeat (the median of those ratios)."""
    out: dict = {}
    labels = dict.fromkeys(r["config"] for r in runs if "config" in r)
    for label in labels:
        rows = [r for r in runs if r.get("config") == label and "examples_per_s" in r]
        if not rows:
            continue
        ratios, cpu_ratios = [], []
        for r in rows:
            tf1 = [x for x in runs if x.get("config") == "tf1 single"
                   and x["repeat"] == r["repeat"]
                   and "examples_per_s" in x]
            if tf1:
                ratios.append(r["examples_per_s"] / tf1[0]["examples_per_s"])
                if r.get("examples_per_cpu_s") and tf1[0].get("examples_per_cpu_s"):
                    cpu_ratios.append(r["examples_per_cpu_s"] / tf1[0]["examples_per_cpu_s"])
        out[label] = {
            "examples_per_s": common.median([r["examples_per_s"] for r in rows]),
            "all": [r["examples_per_s"] for r in rows],
            "fraction_of_ceiling": common.median([r["fraction_of_ceiling"] for r in rows]),
            "fraction_of_ceiling_cpu": common.median(
                [r.get("fraction_of_ceiling_cpu") or 0 for r in rows]),
            "vs_tf1_single": round(common.median(ratios), 2) if ratios else None,
            # per CPU-second: what to read on a shared machine, where each process's
            # share of the cores (and so its wall-time rate) moves with the load
            "vs_tf1_single_cpu": round(common.median(cpu_ratios), 2) if cpu_ratios else None,
            "all_vs_tf1_single_cpu": [round(x, 2) for x in cpu_ratios],
            "all_fraction_of_ceiling_cpu": [r.get("fraction_of_ceiling_cpu") for r in rows],
            "loads": [r["load_average"][0] for r in rows]}
    return out


if __name__ == "__main__":
    sys.exit(main())
