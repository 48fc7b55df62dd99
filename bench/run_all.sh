#!/usr/bin/env bash
# Every benchmark, one after another (about 2 hours on 2 cores), then the memory
# summary. Each writes bench/results/<name>.json and .png and stops every process it
# started, on Ctrl-C too. Run from anywhere: bash bench/run_all.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=2

quick=()
if [[ "${1:-}" == "--quick" ]]; then
  quick=(--quick)
fi

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
python -m bench.throughput "${quick[@]}"
# The two defaults and the promising variants again, interleaved, with CPU time per step.
python -m bench.throughput "${quick[@]}" --repeats 2 --name throughput_core \
  --only "trainer (defaults),keras fit (defaults),keras mixed_bfloat16,keras float-once"
python -m bench.overhead "${quick[@]}"
python -m bench.scaling "${quick[@]}"
python -m bench.tuning "${quick[@]}"
if [[ ${#quick[@]} -eq 0 ]]; then
  python -m bench.serving_bench
  python -m bench.batch_predict
  python -m bench.input_pipeline
  python -m bench.local_update
  python -m bench.zoo --steps 100
else
  python -m bench.serving_bench --seconds 2
  python -m bench.batch_predict --cnn-instances 300 --tabular-instances 3000 --seconds 1
  python -m bench.input_pipeline --batches 500
  python -m bench.local_update --functions 3
  python -m bench.zoo --steps 20
fi
python -m bench.ps_speed "${quick[@]}"
# The CNN's ps setups four times over, interleaved, with the opt-in bfloat16 ones (their
# accuracy after the same steps is a mean: one run moves by a point or more).
python -m bench.ps_speed "${quick[@]}" --model cnn --repeats 4 --name ps_speed_cnn_repeats \
  --only "mljob single node,mljob ps step by step,mljob ps defaults,mljob single node mixed bfloat16,mljob ps defaults mixed bfloat16,mljob ps defaults mixed bfloat16 one intra-op thread,tf1 ps adam,tf1 ps sgd"
# Needs root, ip netns, tc and gcc; exit 2 with the reason when they are missing.
python -m bench.ps_links "${quick[@]}" || echo "bench.ps_links did not run (see above)"
# --runner ray against the local runner; needs Ray (pip install -e '.[ray]').
if python -c "import ray" 2>/dev/null; then
  python -m bench.ray_runner "${quick[@]}"
else
  echo "bench.ray_runner did not run: Ray is not installed"
fi
if [[ ${#quick[@]} -eq 0 ]]; then
  # The long runs: CNN on the full Fashion-MNIST to >= 90% (tens of minutes each).
  python -m bench.accuracy_curves --setup single --timeout 1800
  python -m bench.accuracy_curves --setup ps --timeout 1800
  # Each way of updating the ps for 4,000 steps, then their accuracy by step on one plot.
  python -m bench.accuracy_curves --setup ps --extra="--no-ps-local-steps" --name-suffix _step_by_step
  python -m bench.accuracy_curves --setup ps --name-suffix _defaults
  python -m bench.accuracy_curves --setup ps --extra="--mixed-precision mixed_bfloat16" \
    --name-suffix _defaults_mixed_bfloat16
  python -m bench.accuracy_curves --compare _step_by_step,_defaults,_defaults_mixed_bfloat16
  # Time to accuracy: mljob single and ps against Keras fit and TF1's designs, CNN and MLP;
  # the full default job in both precisions; the single node against TF1 and the ceiling.
  python -m bench.time_to_accuracy
  python -m bench.time_to_accuracy --final
  python -m bench.single_node
  python -m bench.ps_merge
fi
python -m bench.memory
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
