#!/bin/bash
# The GPU check of the torch calibration: on one CUDA GPU, time one layer's attention three
# ways (attention_variants.py -> attention.json), calibrate Llama-3.1-8B and
# Qwen3-8B (`sim calibrate --backend torch --device cuda`, public config.json in
# benchmarks/gpu/models/) and time the independent reference probes of the same shapes
# (../shared/measurements/h200/probe_shapes.py, copied beside this script first: ../shared
# does not travel to a device machine) and mixed steps (mixed_reference.py). Writes into
# $OUT (default ./gpu-out): attention.json, calibrate-torch-cuda-MODEL.json,
# MODEL-shape-torch-probes.json, MODEL-shape-torch-probes-mixed.json, log.txt (8 files)
# Each calibrated profile is then checked there against the same run's reference probes
# (`sim profile check`, into log.txt); redo it here with the files that come back.
# MODELS="qwen3-8b" (names under benchmarks/gpu/models/) runs fewer models; the default is both.
# Needs torch with CUDA, and this project importable (PYTHONPATH or an install); about 7 minutes on an H200.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
# logs go to log.txt only: a device call returns at most 8 files, and this writes 8
timeout 100 python3 benchmarks/gpu/attention_variants.py > "$OUT/attention.json" 2> /tmp/attention.log
grep -E "^(prefill|cached|decode)" /tmp/attention.log
for m in ${MODELS:-llama3.1-8b qwen3-8b}; do
  t0=$(date +%s)
  timeout 200 python3 -c "import sys; from agentsim.cli import main; sys.exit(main(sys.argv[1:]))" calibrate \
    --backend torch --device cuda --model benchmarks/gpu/models/$m --max-model-len 32768 \
    --out "$OUT/calibrate-torch-cuda-$m.json" 2>&1 | tr '\r' '\n' | grep -v "calibrate (torch)" | tail -10
  echo "calibrate $m wall $(( $(date +%s) - t0 )) s"
  t0=$(date +%s)
  (cd "$OUT" && SHAPE=$m timeout 100 python3 "$REPO/benchmarks/gpu/probe_shapes.py" > /dev/null 2>&1 \
     && mv "gpu_probe_$m.json" "$m-shape-torch-probes.json")
  echo "reference probes $m wall $(( $(date +%s) - t0 )) s"
  t0=$(date +%s)
  timeout 100 python3 benchmarks/gpu/mixed_reference.py benchmarks/gpu/models/$m > "$OUT/$m-shape-torch-probes-mixed.json" \
    || rm -f "$OUT/$m-shape-torch-probes-mixed.json"
  echo "mixed reference $m wall $(( $(date +%s) - t0 )) s"
  probes=$(ls "$OUT/$m-shape-torch-probes.json" "$OUT/$m-shape-torch-probes-mixed.json" 2>/dev/null | sed 's/^/--probes /')
  [ -f "$OUT/calibrate-torch-cuda-$m.json" ] && [ -n "$probes" ] && \
    python3 -c "import sys; from agentsim.cli import main; sys.exit(main(sys.argv[1:]))" profile check \
      "$OUT/calibrate-torch-cuda-$m.json" $probes
done
