#!/usr/bin/env bash
# The one prepared script for a GPU machine (issue 36): the `gpu` tests (tests/gpu/), then benchmarks/gpu.py, each
# under a timeout, so that the whole check fits one ~10 minute slot. Everything lands in $OUT (default
# benchmarks/results/gpu): gpu_tests.log / .xml, gpu.json / gpu.md (the benchmark), gpu_bench.log, nvidia_smi.txt.
#
#   scripts/gpu_check.sh              # on the GPU machine
#   scripts/gpu_check.sh --tiny       # a dry run on CPU: the tests are collected (and skip), the benchmark --tiny
#
# Settings (environment): PYTHON (default python), OUT, TEST_TIMEOUT (s, default 180), BENCH_BUDGET (s, default 300:
# benchmarks/gpu.py --budget; its own timeout is 60 s more: at most ~9 minutes in all), BENCH_ARGS (more options).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-benchmarks/results/gpu}
TEST_TIMEOUT=${TEST_TIMEOUT:-180}
BENCH_BUDGET=${BENCH_BUDGET:-300}
TINY=""
[ "${1:-}" = "--tiny" ] && TINY="--tiny"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
mkdir -p "$OUT"
start=$(date +%s)
{ nvidia-smi || echo "no nvidia-smi"; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"; } \
    > "$OUT/nvidia_smi.txt" 2>&1

timeout -k 10 "$TEST_TIMEOUT" "$PY" -m pytest tests/gpu -m gpu -q -p no:cacheprovider -rfEs \
    --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
tests_rc=$?
echo "gpu tests: exit $tests_rc ($(( $(date +%s) - start )) s)"; tail -n 30 "$OUT/gpu_tests.log"

# shellcheck disable=SC2086
timeout -k 10 $(( BENCH_BUDGET + 60 )) "$PY" benchmarks/gpu.py $TINY --budget "$BENCH_BUDGET" --out "$OUT" \
    ${BENCH_ARGS:-} > "$OUT/gpu_bench.log" 2>&1
bench_rc=$?
echo "benchmark: exit $bench_rc ($(( $(date +%s) - start )) s)"; tail -n 80 "$OUT/gpu_bench.log"
[ "$tests_rc" -eq 0 ] || [ "$tests_rc" -eq 5 ] || exit "$tests_rc"  # 5: nothing ran (no CUDA: all skipped)
exit "$bench_rc"
