#!/usr/bin/env bash
# The GPU checks, in one go, ON the GPU machine (from the repository root, with .gpu carried):
#     scripts/gpu_tests.sh [all|tests|graph|bench|trainer|vlm|multi|multi-tests|multi-graph|multi-bench]
# One GPU (all = tests graph bench):
#   tests: tests/test_gpu.py (skipped elsewhere: they need CUDA);
#   graph: the acceptance run omnigraph run graphs/gpu/grpo_one_step_off.yaml (reward must rise);
#   bench: bench/gpu.py (last line JSON; BENCH_ARGS).
# One GPU, each on its own (a command of its own, at most 10 minutes):
#   trainer: bench/gpu_trainer.py (TRAINER_ARGS, e.g. --shapes 0.5b,1.5b); vlm: bench/gpu_vlm.py (VLM_ARGS).
# Two GPUs (multi = multi-graph multi-bench multi-tests):
#   multi-tests: tests/test_gpu_multi.py; multi-graph: graphs/gpu/grpo_one_step_off_2gpu.yaml (trainer and
#   rollout on a card each, weights over NCCL; reward must rise); multi-bench: bench/gpu_multi.py (MULTI_BENCH_ARGS).
# Logs go to $OUT (the device tool brings them back) or ./gpu-logs.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh || exit 1
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
# benchmark records come back with the logs (copy them into bench/results/); pass OMNIGRAPH_GIT_REV in: the
# machine's copy of the tree has no (or a stale) .git
export OMNIGRAPH_BENCH_RESULTS=${OMNIGRAPH_BENCH_RESULTS:-$LOGS/results}
what=${1:-all}
status=0
want() { for w in "$@"; do [ "$what" = "$w" ] && return 0; done; return 1; }

echo "== machine (NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE)"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
"$OG_PY" -c 'import torch, transformers, ray, pydantic; print("torch", torch.__version__, "cuda", torch.version.cuda,
"gpus", torch.cuda.device_count(), "| transformers", transformers.__version__, "| ray", ray.__version__,
"| pydantic", pydantic.__version__)' || exit 1

tests() {   # tests FILE LOG
    echo "== $1"
    timeout "${TESTS_TIMEOUT:-300}" "$OG_PY" -m pytest -q -p no:cacheprovider "$1" 2>&1 | tee "$LOGS/$2"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

graph() {   # graph YAML LOG
    echo "== omnigraph run $1"
    rm -rf /tmp/og-runs
    timeout "${GRAPH_TIMEOUT:-240}" "$OG_PY" -m omnigraph.cli run "$1" --run-dir /tmp/og-runs --quiet \
        ${GRAPH_ARGS:-} 2>&1 | tee "$LOGS/$2.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    run=$(ls -dt /tmp/og-runs/*/ 2>/dev/null | head -1)
    if [ -n "$run" ]; then
        tar -C "$run" -czf "$LOGS/$2_run.tar.gz" --exclude='checkpoints' --exclude='final' .
        "$OG_PY" - "$run" <<'PY' | tee -a "$LOGS/$2.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
r = [x["reward_mean"] for x in rows if x.get("reward_mean") is not None]
k = max(1, len(r) // 6)
first, last = sum(r[:k]) / k, sum(r[-k:]) / k
print(f"reward first {k} steps {first:.3f} -> last {k} steps {last:.3f}: {'RISES' if last > first + 0.1 else 'DOES NOT RISE'}")
PY
    fi
}

bench() {   # bench SCRIPT LOG ARGS...
    local script=$1 log=$2; shift 2
    echo "== $script $*"
    timeout "${BENCH_TIMEOUT:-420}" "$OG_PY" "$script" "$@" 2>&1 | tee "$LOGS/$log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
}

want all tests && tests tests/test_gpu.py test_gpu.log
want all graph && graph graphs/gpu/grpo_one_step_off.yaml graph
want all bench && bench bench/gpu.py bench_gpu.log ${BENCH_ARGS:-}
want trainer && bench bench/gpu_trainer.py bench_gpu_trainer.log ${TRAINER_ARGS:-}
want vlm && bench bench/gpu_vlm.py bench_gpu_vlm.log ${VLM_ARGS:-}
want multi multi-graph && graph graphs/gpu/grpo_one_step_off_2gpu.yaml graph_2gpu
want multi multi-bench && bench bench/gpu_multi.py bench_gpu_multi.log ${MULTI_BENCH_ARGS:-}
want multi multi-tests && tests tests/test_gpu_multi.py test_gpu_multi.log
exit $status
