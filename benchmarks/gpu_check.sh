#!/usr/bin/env bash
# GPU check on a CUDA machine: the default pair on cuda:0 with bf16 mixed precision, one short simulate, the
# side-by-side step of benchmarks/bench_vs_trl.py on the GPU, the vLLM engine's GPU test where vllm imports, and the
# sharded trainer over NCCL with 2 or more GPUs (docs/distributed.md); writes a small JSON of the timings.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]          # default OUT_DIR: runs/gpu-check
#
# Needs: torch with CUDA, this package and the packaged models (README "Quickstart"); the TRL part also needs
# `pip install -e ".[bench]"` (skipped, and said so in the JSON, without it). Everything runs offline.
# Environment: STEPS (simulate steps, default 2), REPS (bench pairs, default 2), SIZES (default "2x4 4x8").
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-runs/gpu-check}" && cd "${1:-runs/gpu-check}" && pwd)"
steps="${STEPS:-2}"
reps="${REPS:-2}"
sizes="${SIZES:-2x4 4x8}"
py="${PYTHON:-python}"
cd "$root"
export HF_HUB_OFFLINE=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"

"$py" - <<'EOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: torch sees no CUDA device (torch %s, CUDA build %s)" % (torch.__version__, torch.version.cuda))
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__, "| CUDA", torch.version.cuda)
EOF

# 1. The default pair on cuda:0, bf16 autocast, a short run.
"$py" - "$root/examples/default.toml" "$out/gpu.toml" "$steps" <<'EOF'
import sys, tomllib, tomli_w
src, dst, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg = tomllib.load(open(src, "rb"))
cfg["run"]["steps"] = steps
for agent in cfg["agents"]:
    agent["model"]["device"] = "cuda:0"          # both workers share GPU 0
    agent["model"]["autocast"] = "bfloat16"      # mixed precision; float32 weights and AdamW state
open(dst, "wb").write(tomli_w.dumps(cfg).encode())
EOF
t0=$(date +%s.%N)
hacrl-fed simulate --config "$out/gpu.toml" --output-dir "$out/runs" --run-name gpu-check --no-progress \
  > "$out/simulate.log" 2>&1
t1=$(date +%s.%N)

# 2. The side-by-side step with TRL on the GPU (bf16 mixed precision on both sides).
bench_status="skipped: trl is not installed (pip install -e \".[bench]\")"
if "$py" -c "import trl" 2>/dev/null; then
  # shellcheck disable=SC2086
  "$py" benchmarks/bench_vs_trl.py --device cuda:0 --precision bf16 --sizes $sizes --reps "$reps" \
    --out "$out/vs-trl-gpu" > "$out/bench_vs_trl.log" 2>&1 && bench_status=ok || bench_status="failed: see bench_vs_trl.log"
fi
t2=$(date +%s.%N)

# 2b. The vLLM engine's GPU test (a tiny model: generation, behaviour log-probs, a weight sync), where vllm imports.
vllm_status="skipped: vllm is not importable here (README \"Rollout engines\")"
if "$py" -c "import vllm" 2>/dev/null; then
  "$py" -m pytest -q -p no:cacheprovider -m gpu tests/worker/test_vllm_engine.py > "$out/vllm_engine.log" 2>&1 \
    && vllm_status=ok || vllm_status="failed: see vllm_engine.log"
fi

# 2c. The sharded trainer (docs/distributed.md): the 2-process CPU equality test, then with 2 or more GPUs one
# update over NCCL at N = 1 and 2 (peak memory per rank; FSDP2 with every rank on its own GPU).
fsdp_status="failed: see fsdp.log"
"$py" -m pytest -q -p no:cacheprovider tests/distributed/test_equal_update.py > "$out/fsdp.log" 2>&1 \
  && fsdp_status="cpu equality ok"
if [ "$("$py" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  "$py" benchmarks/bench_fsdp_memory.py --model smollm2-135m-instruct --nprocs 1 2 --device cuda \
    --json "$out/fsdp_memory.json" >> "$out/fsdp.log" 2>&1 \
    && fsdp_status="$fsdp_status; nccl 2-GPU update ok (fsdp_memory.json)" || fsdp_status="$fsdp_status; nccl failed: see fsdp.log"
else
  fsdp_status="$fsdp_status; nccl skipped: fewer than 2 GPUs"
fi
echo "sharded trainer: $fsdp_status"

# 3. One JSON of the timings.
"$py" - "$out" "$t0" "$t1" "$t2" "$bench_status" "$vllm_status" "$fsdp_status" <<'EOF'
import json, sys
from pathlib import Path
import torch
out, t0, t1, t2, status = Path(sys.argv[1]), *map(float, sys.argv[2:5]), sys.argv[5]
vllm_status, fsdp_status = sys.argv[6], sys.argv[7]
report = json.loads((out / "runs" / "gpu-check" / "report.json").read_text())
summary = {
    "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
    "simulate": {"wall_s": t1 - t0, "config": str(out / "gpu.toml"), "phases_s": report.get("phases", {}),
                 "agents": report.get("agents", {})},
    "bench_vs_trl": {"status": status, "wall_s": t2 - t1},
    "vllm_engine": {"status": vllm_status},
    "sharded_trainer": {"status": fsdp_status},
}
bench = out / "vs-trl-gpu" / "results.json"
if status == "ok" and bench.is_file():
    for s in json.loads(bench.read_text())["sizes"]:
        if "failed" in s:
            summary["bench_vs_trl"][s["size"]] = {"failed": s["failed"]}
            continue
        summary["bench_vs_trl"][s["size"]] = {
            "ratio_hacrl_over_trl": {k: v["median"] for k, v in s["ratio_hacrl_over_trl"].items()},
            "median": s["median"], "same_completions": s["same_completions"],
            "delta_cosine": s.get("delta_cosine"), "grad_norm": s["grad_norm"]}
(out / "gpu_check.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
EOF
