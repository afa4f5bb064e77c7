#!/bin/bash
# One device call of the ZeRO-3 step matrix (run from the repo root on the GPU machine):
#   bash benchmarks/.whl/d24/zero3_device.sh MATRIX BUDGET_S TAG
# The harness files travel in the folder this script sits in (a copy of benchmarks/). OpenRLHF lets
# DeepSpeed build its optimizer, so DeepSpeed's FusedAdam and CPUAdam ops are JIT-built first (in the
# foreground: a build beside running launches slows their CPU-bound ZeRO-3 hooks) or unpacked from
# the tx.tgz.* parts an earlier call returned.
D=$(cd "$(dirname "$0")" && pwd)
. benchmarks/device_setup.sh || exit 1
export TORCH_EXTENSIONS_DIR=/tmp/tx ZERO3_OPS_MARKER=/tmp/ops_ready
if ls "$D"/tx.tgz.* >/dev/null 2>&1; then cat "$D"/tx.tgz.* | tar -xzf - -C /; fi
t0=$(date +%s)
python3 -c "from deepspeed.ops.op_builder import FusedAdamBuilder as B; B().load()" >"$OUT/ops_build.log" 2>&1 &
python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder as B; B().load()" >/tmp/cpu_adam.log 2>&1
rc=$?; wait $! ; rc=$((rc + $?)); cat /tmp/cpu_adam.log >>"$OUT/ops_build.log"
if [ $rc = 0 ]; then echo ok >$ZERO3_OPS_MARKER; else echo fail >$ZERO3_OPS_MARKER; fi
echo "ops $(cat $ZERO3_OPS_MARKER) in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; free -g | head -2
python3 "$D/run_matrix.py" --matrix "$1" --out "$OUT/rows.jsonl" --budget-s "$2" --gpus 0,1 --gpu-gib 76 \
  --per-gpu 1 --host-gib 220 --margin-s 8 --work-dir /tmp/zw --tag "$3"
ls "$D"/tx.tgz.* >/dev/null 2>&1 || tar -czf - /tmp/tx 2>/dev/null | split -b 15m - "$OUT/tx.tgz."
ls -la "$OUT"
