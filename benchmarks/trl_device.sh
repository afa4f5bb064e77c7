#!/bin/bash
# One device call of the TRL learner matrix (benchmarks/trl_matrix.txt) on 2 GPUs: installs the carried
# wheels (DeepSpeed built from its sdist with DS_BUILD_OPS=0), writes hpcrl's accelerate config and
# DeepSpeed JSON (carried as JSON from hpcrl/planning/backends/trl_launch.py), runs each launch line under
# `accelerate launch` with a time limit, world-1 lines two at a time (one per GPU), then world-2 lines.
#   bash benchmarks/trl_device.sh CARRY_DIR BUDGET_S
set -u
CARRY=$1; BUDGET=${2:-480}; START=$(date +%s)
export TORCH_CUDA_ARCH_LIST=9.0 DS_BUILD_OPS=0 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=$CARRY/whl
python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w /tmp/dsw $W/deepspeed-*.tar.gz || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $W/*.whl /tmp/dsw/deepspeed-*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -c "import trl, deepspeed, datasets, torch, transformers, accelerate; print('VERSIONS', trl.__version__, deepspeed.__version__, torch.__version__, transformers.__version__, accelerate.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])" || exit 1
OUTF=${OUT:-/tmp}/trl_rows.jsonl
run() {  # run WORLD GPUS PORT TIMEOUT ARGS...
  local world=$1 gpus=$2 port=$3 lim=$4; shift 4
  local left=$(( BUDGET - ($(date +%s) - START) ))
  [ "$left" -lt 60 ] && { echo "SKIP (budget) $*"; return; }
  [ "$lim" -gt "$left" ] && lim=$left
  echo "START $(date +%s) world=$world gpus=$gpus $*"
  CUDA_VISIBLE_DEVICES=$gpus timeout "$lim" python3 -m accelerate.commands.launch \
    --config_file "$CARRY/acc_w$world.yaml" --num_processes "$world" --main_process_port "$port" \
    "$CARRY/trl_memory.py" --configs-dir "$CARRY/configs" "$@" --out "$OUTF" < /dev/null > "/tmp/log_$port.txt" 2>&1
  echo "END rc=$? $(date +%s) $*"; tail -n 4 "/tmp/log_$port.txt"
}
sed -i "s#DSFILE#$CARRY/ds_zero3.json#" "$CARRY/acc_w1.yaml" "$CARRY/acc_w2.yaml"
while read -r world rest; do
  case "$world" in "#"*|"") continue;; esac
  if [ "$world" = 1 ]; then echo "1 $rest" >> /tmp/w1.txt; else echo "2 $rest" >> /tmp/w2.txt; fi
done < "$CARRY/trl_matrix.txt"
# world-1 lines: alternate GPUs, two at a time
i=0; while read -r _ lim rest; do
  gpu=$(( i % 2 )); run 1 $gpu $(( 29600 + i )) "$lim" $rest &
  i=$(( i + 1 )); [ $(( i % 2 )) -eq 0 ] && wait
done < /tmp/w1.txt; wait
i=0; while read -r _ lim rest; do run 2 0,1 $(( 29700 + i )) "$lim" $rest; i=$(( i + 1 )); done < /tmp/w2.txt
echo "ROWS $(wc -l < "$OUTF")"; cp /tmp/log_*.txt "${OUT:-/tmp}/" 2>/dev/null; true
