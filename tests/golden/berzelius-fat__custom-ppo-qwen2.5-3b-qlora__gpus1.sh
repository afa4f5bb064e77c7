#!/bin/bash
# Rendered by hpcrl 0.1.0: re-render (hpcrl render) rather than edit by hand.
# hpcrl cluster: berzelius:fat
# hpcrl config: custom-ppo-qwen2.5-3b-qlora.yaml (digest 108c5ebd311f)
#
# Plan:
#   model Qwen/Qwen2.5-3B: 4 sequences of 384 tokens per step, mini_batch_size 4 (1536 tokens), generate 4 sequences at once
#   1 A100-SXM4-80GB (79.15 GiB) of one node, not the whole node (--gpus 1): all 1 GPUs train and generate (colocated)
#   custom: python qwen_gsm8k_ppo_train.py, 1 process(es) on 1 GPU(s); ppo with LoRA r8 on a 4-bit NF4 base, critic value_head, reference shared; HF generate, no vLLM, no Ray
#   one GPU generates (HF generate, KV cache 0.05 GiB) and trains: peak 9.2 GiB of 79.2 usable at training (derived); host 6 GiB of 250 GiB
#   step ~6-17 s (mid ~10 s) (generation 9 s, training 1 s), bottleneck generation; the checkpoint cadence and time-limit lead use the upper estimate
#   step basis: generation: derived (uncalibrated): HF generate, bf16 weight + KV reads at 50% of HBM peak + 30 ms per token; not checked against a measured HF-generate step (4-bit dequantization per token, PPO's extra forwards and Python overheads are not modelled), a real step may take 2-3x the estimate; training: learner 2 x 0.32 s + optimizer step 0.00 s, fitted on 40 measured rows (fsdp_measured, openrlhf_measured, zero3_timing; H100/H200); derived: A100-SXM4-80GB scaled from H100/H200 by peak FLOP/s and bandwidths, 4-bit dequantization, no ZeRO sharding (one process or DDP), bf16 LoRA adapters (the rows' are peft's fp32)
#   save_steps 200: a checkpoint every ~57 min of training at the upper step estimate ~17 s (pinned in the config); time-limit warning 900 s before the end = one upper step (~17 s) + one checkpoint write (~3 s, derived) + 60 s to stop
# Warning: berzelius: the script uses unconfirmed profile facts: --partition=berzelius (hpcrl.partition); the run root /proj/$SLURM_JOB_ACCOUNT/users/$USER/hpcrl-runs (hpcrl.run_root); check them (hpcrl clusters show berzelius) or set what is in brackets
# Warning: save_steps 200 (pinned) risks ~57 min of training at each job's end or fault, over hpcrl.max_lost_minutes 30: remove it and hpcrl sets 104
# Warning: resume none: the script declares no way to resume (set resume: marker or own if it does), so a job that reaches its time limit does not continue the chain (a new job would train from scratch); give the run a wall time it can finish in, or save its state
#
# Submit with `hpcrl submit`, which creates the run directory first. With plain sbatch,
# create <run dir>/logs first when --output points there: Slurm opens it before this runs.
# docs/render.md explains every part of this script.
#SBATCH --job-name=hpcrl-qwen2.5-3b-gsm8k-ppo
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus=1
#SBATCH --cpus-per-gpu=16
#SBATCH --time=2-00:00:00
#SBATCH --partition=berzelius
#SBATCH --constraint=fat
#SBATCH --output=hpcrl-qwen2.5-3b-gsm8k-ppo-%j.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@900
#SBATCH --no-requeue

set -euo pipefail
set -o errtrace  # the ERR trap below reports a failure inside the phase functions too
# Files this job creates (run directory, logs, node-local directories) are the user's alone (umask 077).
umask 077

if [[ -z ${SLURM_JOB_ID:-} ]]; then
    echo "hpcrl: error: submit this script with sbatch or hpcrl submit (SLURM_JOB_ID is not set)" >&2
    exit 2
fi

log() { printf 'hpcrl: %s\n' "$*"; }
# phase NAME: the next phase begins, unless a stop (a signal's trap: TERM, the time-limit warning) came
# before any driver ran to pass it to: then the job ends with the stop's reason instead.
phase() {
    if [[ -n ${STOP_REASON:-} && $1 != stop ]]; then
        finish "$STOP_REASON" 143
    fi
    log "phase $1"
}
on_err() { printf 'hpcrl: error: exit code %s at line %s: %s\n' "$1" "$2" "$3" >&2; }
trap 'on_err "$?" "$LINENO" "$BASH_COMMAND"' ERR

# functions_of NAME...: the definitions (declare -f) of NAME and of every function of this script that
# their bodies name, transitively. A `bash -c` in a step of its own needs them (srun and timeout pass
# the exported environment, not shell functions), and a list kept by hand misses the next one added.
# A name that only appears in a body's text is shipped too, which is harmless.
functions_of() {
    local -A seen=()
    local -a queue=("$@") all
    local fn other body
    mapfile -t all < <(compgen -A function)
    while ((${#queue[@]})); do
        fn=${queue[0]}
        queue=("${queue[@]:1}")
        [[ -z ${seen[$fn]:-} ]] || continue
        seen[$fn]=1
        body=$(declare -f -- "$fn")
        for other in "${all[@]}"; do
            if [[ -z ${seen[$other]:-} && $body =~ (^|[^A-Za-z0-9_])"$other"([^A-Za-z0-9_]|$) ]]; then
                queue+=("$other")
            fi
        done
    done
    declare -f -- "${!seen[@]}"
}

# State read by the traps below.
END_REASON=""
END_RECORDED=""
STOP_REASON=""
STOP_DEADLINE=""
STOP_BY=""
DRAIN_UNTIL=""
DRAIN_STAMP=""
HEAD_NODE=${SLURMD_NODENAME:-$(hostname -s)}
CONTINUED=""
HPCRL_DIR=""
HEAD_PID=""
WORKERS_PID=""
DRIVER_PID=""
DRIVER_CODE=0
MON_PID=""
NODE_DIR=""
RAY_TMP=""
TEE_PID=""
WATCHDOG_BEAT=""  # the watchdog's heartbeat file (node-local), once the driver starts
WATCHDOG_HUNG=""  # set once it stopped beating
RUN_DIR_FAILED=""  # run-dir-full or run-dir-unwritable once a write into the run directory failed
SVC_PIDS=()  # services started on this node (hpcrl.code_server)

# ------------------------------------------------------------------ environment
# The profile's and the config's environment. Their lines run inside this function: a `declare`
# in them (or in a file they source) makes a variable local to it; `export` or `declare -g` does not.
profile_environment() {
    # Model and dataset cache on shared storage; jobs never download (pre-fetch on a login node).
    export HF_HOME=/proj/"${SLURM_JOB_ACCOUNT}"/users/"${USER}"/hf
    export HF_HUB_OFFLINE=1
    # hpcrl.env_setup: shell lines from the run config, run verbatim (not quoted) on purpose.
    # They run once, here on the head node; the worker step inherits their exported variables.
    set +u
module load Miniforge3/24.7.1-2-hpc1-bdist
mamba activate finellama
    set -u
}

# ------------------------------------------------------------------ run directory and job chain
# One directory per run, the same on every restart, so open-instruct's checkpoint_state_dir
# is found again and the run resumes (docs/run-dir.md; its layout is hpcrl/contract.py's).
run_directory() {
    unset RAY_ADDRESS
    RUN_DIR=/proj/"${SLURM_JOB_ACCOUNT}"/users/"${USER}"/hpcrl-runs/qwen2.5-3b-gsm8k-ppo
    [[ $RUN_DIR == /* ]] || RUN_DIR=$PWD/$RUN_DIR
    # Every level of its path is the user's or root's, and no one else may write it (safe_path, as for
    # the node-local path; storage.run_root_shared: a level the project's group may write, or
    # another member owns, is warned about): whoever may rename a level could move the run directory
    # away and put a link in its place, and this job's records, logs and the script its continuation
    # runs would go where they chose. From here on the job uses its physical path.
    local rc=0
    safe_path "run directory's path" hpcrl.run_root "$RUN_DIR" make "${RUN_ROOT_SHARED:+shared}" || rc=$?
    if ((rc == 0)) && [[ $(stat -c %u -- "$SAFE_PATH") != "$(id -u)" ]]; then
        echo "hpcrl: error: the run directory $SAFE_PATH belongs to $(stat -c %U -- "$SAFE_PATH")," \
            "not to $(id -un); refusing to use it" >&2
        rc=3
    fi
    if ((rc != 0)); then
        refuse_run_dir
    fi
    RUN_DIR=$SAFE_PATH
    HPCRL_DIR=$RUN_DIR/hpcrl
    mkdir -p -- "$RUN_DIR/hpcrl" "$RUN_DIR/logs" "$RUN_DIR/output" "$RUN_DIR/checkpoints"
    export HPCRL_RUN_DIR=$RUN_DIR
    # Everything below also goes to logs/job-<id>.log. tee ignores TERM so that the log
    # survives scancel/preemption (Slurm signals every process) until the final SIGKILL. A run
    # dir that fails (EIO, full) makes tee drop that file, and exit once Slurm's log fails too:
    # cat then reads on, so that no write of this script ever meets a closed pipe (SIGPIPE).
    exec > >(
        trap '' TERM INT
        tee -a -- "$RUN_DIR/logs/job-$SLURM_JOB_ID.log" || true
        exec cat >/dev/null
    ) 2>&1
    TEE_PID=$!
    # Slurm SIGKILLs every process of the job KillWait seconds after its TERM (scancel, preemption,
    # the time limit itself): a stop that a TERM starts is planned to end inside that window, the
    # driver's share first, then Ray's, with STOP_RESERVE_S left for the last record and cleanup.
    # (awk reads to the end: an early exit would SIGPIPE scontrol and fail the pipeline.)
    KILL_WAIT_S=$(scontrol show config 2>/dev/null | awk '$1 == "KillWait" && !n++ { print $3 + 0 }') || KILL_WAIT_S=""
    if [[ ! $KILL_WAIT_S =~ ^[0-9]+$ ]] || ((KILL_WAIT_S < 1)); then
        KILL_WAIT_S=30  # the profile's slurm.kill_wait_s: scontrol did not say
    fi
    TERM_DRIVER_S=$((KILL_WAIT_S * 4 / 10 > 1 ? KILL_WAIT_S * 4 / 10 : 1))
    # The file the framework rewrites once a checkpoint is complete.
    CKPT_MARKER=$RUN_DIR/checkpoints/latest

    # Before anything of the run dir is touched: a job of another live chain leaves it alone.
    claim_run_dir || exit 1
    trap on_exit EXIT
    trap 'on_signal timeout USR1' USR1
    trap 'on_signal term TERM' TERM
    trap 'on_signal term INT' INT

    record start "$HEAD_NODE"

    # This job's script (continuations resubmit it) and the plan it was rendered from.
    if ! cmp -s -- "$0" "$HPCRL_DIR/job.sbatch"; then
        if [[ -e $HPCRL_DIR/job.sbatch ]]; then
            log "warning: $HPCRL_DIR/job.sbatch differs from this job's script; replacing it"
        fi
        cp -- "$0" "$HPCRL_DIR/job.sbatch.$SLURM_JOB_ID.tmp"
        mv -f -- "$HPCRL_DIR/job.sbatch.$SLURM_JOB_ID.tmp" "$HPCRL_DIR/job.sbatch"
    fi
    if [[ ! -e $HPCRL_DIR/plan.json ]]; then
        cat >"$HPCRL_DIR/plan.json.$SLURM_JOB_ID.tmp" <<'HPCRL_PLAN_JSON'
{
  "backend": "custom",
  "backend_args": {
    "gpus": 1,
    "launcher": "python",
    "processes": 1,
    "rollout_batch_size": 4,
    "samples_per_prompt": 1,
    "save_steps": 200
  },
  "cadence": {
    "every_steps": 200,
    "key": "save_steps",
    "lead_s": 900,
    "lora_rank": 8,
    "max_lost_minutes": 30.0,
    "model": {
      "head_dim": 128,
      "hidden_size": 2048,
      "intermediate_size": 11008,
      "max_position_embeddings": 32768,
      "model_type": "qwen2",
      "moe_intermediate_size": 0,
      "name": "Qwen/Qwen2.5-3B",
      "num_experts": 0,
      "num_experts_per_tok": 0,
      "num_heads": 16,
      "num_kv_heads": 2,
      "num_layers": 36,
      "qk_norm": "none",
      "qkv_bias": true,
      "tie_word_embeddings": true,
      "vocab_size": 151936
    },
    "pinned": true,
    "signal_floor_s": 900,
    "step_s": 9.884,
    "write_basis": "derived",
    "write_gib_s": 2.0,
    "write_s": 2.958
  },
  "cluster": "berzelius:fat",
  "config": "custom-ppo-qwen2.5-3b-qlora.yaml",
  "config_digest": "108c5ebd311f",
  "disk": {
    "fits": true,
    "peak_gib": 10.4,
    "quota_gib": 2000.0,
    "run_dir_peak_gib": 4.7,
    "total_steps": 5000
  },
  "gpus_per_node": 1,
  "hpcrl_version": "0.1.0",
  "job_gpus": 1,
  "layout": {
    "bottleneck": "generation",
    "colocated": true,
    "deepspeed_stage": 0,
    "engine_concurrent_seqs": 4,
    "engine_gpus": 1,
    "engine_kv_cache_gib": 0.05,
    "engine_vllm": {
      "max_num_batched_tokens": 0,
      "max_num_seqs": 0,
      "version": "0.19.1"
    },
    "generation_time_basis": "derived (uncalibrated): HF generate, bf16 weight + KV reads at 50% of HBM peak + 30 ms per token; not checked against a measured HF-generate step (4-bit dequantization per token, PPO's extra forwards and Python overheads are not modelled), a real step may take 2-3x the estimate",
    "generation_time_high_s": 16.2,
    "generation_time_low_s": 5.5,
    "generation_time_s": 9.2,
    "gpu_usable_gib": 79.15,
    "host_peak_gib": 6.0,
    "idle_gpus": 0,
    "learner_gpus": 1,
    "learner_peak_gib": 9.18,
    "nodes": 1,
    "num_learners_per_node": [
      1
    ],
    "reason": "colocated: every GPU trains and generates; step ~10s = generation 9s + training 1s (range 6-17s)",
    "rollout_peak_gib": 7.36,
    "step_time_basis": "generation: derived (uncalibrated): HF generate, bf16 weight + KV reads at 50% of HBM peak + 30 ms per token; not checked against a measured HF-generate step (4-bit dequantization per token, PPO's extra forwards and Python overheads are not modelled), a real step may take 2-3x the estimate; training: learner 2 x 0.32 s + optimizer step 0.00 s, fitted on 40 measured rows (fsdp_measured, openrlhf_measured, zero3_timing; H100/H200); derived: A100-SXM4-80GB scaled from H100/H200 by peak FLOP/s and bandwidths, 4-bit dequantization, no ZeRO sharding (one process or DDP), bf16 LoRA adapters (the rows' are peft's fp32)",
    "step_time_high_s": 17.2,
    "step_time_low_s": 5.9,
    "step_time_s": 9.9,
    "training_peak_gib": 9.18,
    "training_time_s": 0.6,
    "vllm_gpu_memory_utilization": 0.0,
    "vllm_num_engines": 1,
    "vllm_tensor_parallel_size": 1
  },
  "loss_keys": [
    "loss",
    "policy_loss",
    "value_loss"
  ],
  "memory": {
    "basis": {
      "derived": "arithmetic from what the libraries allocate (sources in hpcrl/memory/hf_learner.py), not measured by hpcrl",
      "fitted": "a constant fitted on hpcrl's DeepSpeed calibration rows, applied here unchanged",
      "measured": "an idle process's CUDA context, measured"
    },
    "fits": true,
    "generation": {
      "concurrent_seqs": 4,
      "kind": "hf-generate",
      "kv_bytes_per_token": 36864,
      "kv_cache_gib": 0.053,
      "kv_tokens": 1536
    },
    "gpu": {
      "cluster": "berzelius:fat",
      "job_gpus": 1,
      "name": "A100-SXM4-80GB",
      "usable_gib": 79.15
    },
    "host": {
      "breakdown": {
        "training processes (1 x 6 GiB, assumed: constants.HOST_PROCESS_GIB)": 6.0
      },
      "fits": true,
      "peak_gib": 6.0,
      "ram_gib": 250.0
    },
    "learner": {
      "algorithm": "ppo",
      "allocator_margin_gib": 0.893,
      "critic": "value_head",
      "device_total_gib": 9.182,
      "double_quant": false,
      "fits": true,
      "gradient_checkpointing": true,
      "inside_margin": false,
      "kind": "hf-trl",
      "lora_dropout": 0.0,
      "lora_rank": 8,
      "lora_targets": [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj"
      ],
      "micro_seqs": 4,
      "non_torch": {
        "CUDA context (measured)": 0.6
      },
      "peak_allocated_gib": 5.411,
      "peak_phase": "training",
      "peak_reserved_gib": 8.582,
      "phases": {
        "generation": {
          "allocated_gib": 2.478,
          "reserved_gib": 5.19,
          "transient": {
            "HF generate KV cache, bf16, every sequence at full length (derived)": 0.053,
            "generate logits, fp32, last position (derived)": 0.002,
            "one dequantized 4-bit weight, bf16 (derived)": 0.042,
            "prefill activations, one layer, no grad (derived)": 0.025
          }
        },
        "scoring": {
          "allocated_gib": 3.703,
          "reserved_gib": 6.763,
          "transient": {
            "one dequantized 4-bit weight, bf16 (derived)": 0.042,
            "scoring logits, bf16 + fp32 log-softmax, no grad (derived)": 1.304
          }
        },
        "training": {
          "allocated_gib": 5.411,
          "reserved_gib": 8.582,
          "transient": {
            "log-prob path logits, bf16 + eager fp32 log_softmax (fitted)": 2.608,
            "one dequantized 4-bit weight, bf16 (derived)": 0.042,
            "one layer's activations rebuilt in backward (derived)": 0.193,
            "stored activations, bf16 layer inputs (gradient checkpointing) (derived)": 0.211
          }
        }
      },
      "processes": 1,
      "prompt_len": 128,
      "reference": "shared",
      "resident": {
        "AdamW moments, fp32, trainable parameters only (derived)": 0.112,
        "LoRA adapters, fp32 (derived)": 0.056,
        "adapter gradients, fp32 (derived)": 0.056,
        "fixed allocations (workspaces, RNG) (fitted)": 0.1,
        "policy 4-bit quantization constants, fp32 absmax per 64 weights (derived)": 0.161,
        "policy base weights, 4-bit NF4 linears + bf16 embeddings and norms (derived)": 1.872,
        "reference: the policy's base with the adapters off (no copy) (derived)": 0.0,
        "value head, fp32 with its gradient and AdamW moments (derived)": 0.0
      },
      "response_len": 256,
      "rollout_seqs": 4,
      "seq_len": 384,
      "time": {
        "basis": "fitted on 40 measured rows (fsdp_measured, openrlhf_measured, zero3_timing; H100/H200); derived: A100-SXM4-80GB scaled from H100/H200 by peak FLOP/s and bandwidths, 4-bit dequantization, no ZeRO sharding (one process or DDP), bf16 LoRA adapters (the rows' are peft's fp32)",
        "high": 1.56,
        "low": 0.6,
        "micro_batch_s": 0.322,
        "optimizer_step_s": 0.001
      },
      "tokens_per_micro_batch": 1536,
      "weights": "4-bit NF4"
    },
    "model": {
      "name": "Qwen/Qwen2.5-3B",
      "total_params": 3085938688,
      "trainable_params": 14968833
    },
    "verdict": "the learner GPU (peak at training) fits with 69.1 GiB to spare after a 0.9 GiB allocator margin"
  },
  "model": "Qwen/Qwen2.5-3B",
  "nodes": 1,
  "reward_keys": [
    "avg_reward"
  ],
  "run_name": "qwen2.5-3b-gsm8k-ppo",
  "smoke": false,
  "warnings": [
    "berzelius: the script uses unconfirmed profile facts: --partition=berzelius (hpcrl.partition); the run root /proj/$SLURM_JOB_ACCOUNT/users/$USER/hpcrl-runs (hpcrl.run_root); check them (hpcrl clusters show berzelius) or set what is in brackets",
    "save_steps 200 (pinned) risks ~57 min of training at each job's end or fault, over hpcrl.max_lost_minutes 30: remove it and hpcrl sets 104",
    "resume none: the script declares no way to resume (set resume: marker or own if it does), so a job that reaches its time limit does not continue the chain (a new job would train from scratch); give the run a wall time it can finish in, or save its state"
  ]
}
HPCRL_PLAN_JSON
        mv -f -- "$HPCRL_DIR/plan.json.$SLURM_JOB_ID.tmp" "$HPCRL_DIR/plan.json"
    fi
}

# refuse_run_dir: the run directory is not safe to write (above): nothing goes into it; the end goes to
# the node-local fallback and the job's Slurm comment (record), and no node is blamed.
refuse_run_dir() {
    HPCRL_DIR=""
    HPCRL_NODE_LOCAL=/scratch/local
    record end "run-dir-unsafe:1"
    END_RECORDED=1
    log "job $SLURM_JOB_ID ends: run-dir-unsafe:1 (nothing was written into $RUN_DIR)"
    exit 1
}

# The profile's storage.run_root_shared (hpcrl submit reads it here too).
RUN_ROOT_SHARED=1
MAX_RESTARTS=10
MAX_FAILURE_RESTARTS=3
FAILURE_BACKOFF_S=60
GRACE_S=780
# The --signal lead time.
SIGNAL_LEAD_S=900
# Nodes the rendered script excludes; a continuation after a node's failure adds that node.
RENDERED_EXCLUDE=''
# Reserved at the end of Slurm's KillWait (run_directory reads it) for the last record and cleanup.
STOP_RESERVE_S=2
# The longest an end the job reaches by itself waits for the worker step before KILLing it
# (generous: a KILLed worker leaves its node-local dirs behind).
END_STOP_S=60

# One live chain per run dir, whichever registry submitted it (hpcrl/jobs/chain_lock.py): the
# lock file names the chain's newest job; under its flock, a job that finds another job there
# that Slurm still has pending or running refuses to run, else it names itself. The flock is
# held for this check only (a subshell's descriptor), so no process of the job inherits it.
claim_run_dir() {
    set_chain_owner "$SLURM_JOB_ID" check
}

# set_chain_owner JOB [check]: write JOB into the lock file (with check: unless a live other job owns it).
set_chain_owner() {
    (
        if ! flock -w 30 9; then
            log "error: $HPCRL_DIR/chain.lock stayed locked for 30 s"
            exit 1
        fi
        local owner="" state
        read -r owner _ <&9 || true
        if [[ -n ${2:-} && $owner =~ ^[0-9]+$ && $owner != "$SLURM_JOB_ID" ]]; then
            # Pending or running; a job that ends (COMPLETING: this chain's predecessor, should its
            # last write have failed), has ended or is forgotten prints nothing.
            state=$(squeue -h -j "$owner" -t PENDING,CONFIGURING,RUNNING,SUSPENDED -o %T 2>/dev/null) || state=""
            if [[ -n $state ]]; then
                log "error: run dir $RUN_DIR belongs to job $owner ($state), the live chain of another submit; this job leaves it alone"
                exit 1
            fi
        fi
        printf '%s\n' "$1" >"$HPCRL_DIR/chain.lock"
    ) 9<>"$HPCRL_DIR/chain.lock"
}

# jobs.tsv: <job id> <event> <UTC time> <detail>, one line per event (bash's own clock:
# no process to start while a signal is being handled). A run directory that cannot take the
# line never stops the job: it goes to <node-local>/hpcrl-ended-$SLURM_JOB_ID.XXX/jobs.tsv on
# this node (a private directory made once per job, in EVENTS_KEPT) and the job's log, and an `end`
# also to the job's Slurm comment, which `hpcrl status` reads.
record() {
    local line
    TZ=UTC0 printf -v line '%s\t%s\t%(%Y-%m-%dT%H:%M:%SZ)T\t%s\n' "$SLURM_JOB_ID" "$1" -1 "$2"
    if [[ -n $HPCRL_DIR ]] && run_dir_write "$HPCRL_DIR/jobs.tsv" "$line"; then
        return 0
    fi
    if [[ -z ${EVENTS_KEPT:-} && -n ${HPCRL_NODE_LOCAL:-} ]] \
        && private_dir "$HPCRL_NODE_LOCAL" "hpcrl-ended-$SLURM_JOB_ID" 2>/dev/null; then
        EVENTS_KEPT=$PRIVATE_DIR/jobs.tsv
    fi
    if [[ -n ${EVENTS_KEPT:-} ]] && { printf '%s' "$line" >>"$EVENTS_KEPT"; } 2>/dev/null; then
        log "event kept in $EVENTS_KEPT on ${SLURMD_NODENAME:-$(hostname -s)}: ${line%$'\n'}"
    else
        log "event not recorded anywhere on disk: ${line%$'\n'}"
    fi
    if [[ $1 == end ]]; then
        timeout 10 scontrol update JobId="$SLURM_JOB_ID" Comment="hpcrl-end:$2" >/dev/null 2>&1 || true
    fi
}

# run_dir_write FILE TEXT: append TEXT; 1 when the run directory refused it (RUN_DIR_FAILED says why).
run_dir_write() {
    local err
    if { printf '%s' "$2" >>"$1"; } 2>/dev/null; then
        return 0
    fi
    err=$( { printf '%s' "$2" >>"$1"; } 2>&1) && return 0
    run_dir_failed "${err##*: }"
    return 1
}

# run_dir_failed WHY: name the failure (full: the driver may run on; any other: the run dir is gone).
run_dir_failed() {
    local reason=run-dir-unwritable
    case $1 in
        *"No space left on device"* | *"Disk quota exceeded"*) reason=run-dir-full ;;
    esac
    if [[ $RUN_DIR_FAILED != "$reason" && $RUN_DIR_FAILED != run-dir-unwritable ]]; then
        RUN_DIR_FAILED=$reason
        log "error: the run directory $RUN_DIR failed: $1 ($reason)"
    fi
}

# probe_run_dir: 0 while the run directory takes writes; else 1, RUN_DIR_FAILED saying why (a full
# one that has room again is forgiven). An append-mode open meets an I/O error or a read-only file
# system; no free block is a full one.
probe_run_dir() {
    local err
    if [[ $RUN_DIR_FAILED == run-dir-unwritable ]]; then
        return 1
    fi
    if ! { : >>"$HPCRL_DIR/jobs.tsv"; } 2>/dev/null; then
        err=$( { : >>"$HPCRL_DIR/jobs.tsv"; } 2>&1) || run_dir_failed "${err##*: }"
    elif [[ $(stat -f -c %a -- "$HPCRL_DIR" 2>/dev/null) == 0 ]]; then
        run_dir_failed "No space left on device"
    elif [[ -n $RUN_DIR_FAILED ]]; then
        RUN_DIR_FAILED=""
        log "the run directory $RUN_DIR has room again"
    fi
    [[ -z $RUN_DIR_FAILED ]]
}

# Driver exit code -> end reason (hpcrl/contract.py: the watchdog's breakers and the rest).
reason_of() {
    case $1 in
        0) echo completed ;;
        88) echo run-dir-full ;;
        89) echo run-dir-unwritable ;;
        90) echo breaker-zero-reward ;;
        91) echo breaker-nan-loss ;;
        92) echo breaker-hang ;;
        93) echo breaker-dead-worker ;;
        95) echo worker-died ;;
        96) echo breaker-grad-norm ;;
        97) echo breaker-zero-variance ;;
        *) echo crashed ;;
    esac
}

# The nodes this job blames for a failure (the workers and the head write "<node> <why>" lines).
blamed_nodes() {
    if [[ -r $HPCRL_DIR/blame-$SLURM_JOB_ID ]]; then
        awk 'NF { print $1 }' "$HPCRL_DIR/blame-$SLURM_JOB_ID" | sort -u | paste -sd, -
    fi
}

# The --exclude of every continuation: the rendered list plus each node a failure was blamed on.
exclude_list() {
    {
        tr ',' '\n' <<<"$RENDERED_EXCLUDE"
        if [[ -r $HPCRL_DIR/excluded-nodes ]]; then cat -- "$HPCRL_DIR/excluded-nodes"; fi
    } | awk 'NF && !seen[$0]++' | paste -sd, -
}

# sbatch the same script again, after this job ends, from the original submit directory and
# without this job's Slurm/Ray variables (sbatch would pass them on). $1: seconds to wait first.
submit_continuation() {
    local job=$SLURM_JOB_ID extra=() excl
    excl=$(exclude_list)
    if [[ -n $excl ]]; then
        extra+=("--exclude=$excl")
    fi
    if ((${1:-0} > 0)); then
        extra+=("--begin=now+$1")
    fi
    (
        cd -- "${SLURM_SUBMIT_DIR:-$HOME}"
        while read -r var; do
            [[ $var == SLURM_CONF ]] || unset "$var"
        done < <(compgen -e | grep -E '^(SLURM_|SBATCH_|SRUN_|RAY_|HPCRL_)' || true)
        sbatch --parsable --dependency="afterany:$job" "${extra[@]}" "$HPCRL_DIR/job.sbatch"
    )
}

# count_file FILE: the number in it (0 when missing or garbled).
count_file() {
    local n=0
    if [[ -r $1 ]]; then
        n=$(<"$1")
    fi
    [[ $n =~ ^[0-9]+$ ]] || n=0
    echo "$n"
}

# bump_file FILE: one more, written atomically.
bump_file() {
    echo "$(($(count_file "$1") + 1))" >"$1.$SLURM_JOB_ID.tmp"
    mv -f -- "$1.$SLURM_JOB_ID.tmp" "$1"
}

# Which reasons continue: the time limit and preemption (at most hpcrl.max_restarts times), and
# failures that are not the run's fault (at most hpcrl.max_failure_restarts times, counted
# apart, the blamed nodes excluded, after a back-off). Crashes of the training code, circuit
# breakers and cancels never continue.
continue_chain() {
    local reason=$1 next kind counter limit setting wait_s=0 nodes
    case $reason in
        timeout | preempted) kind=limit counter=$HPCRL_DIR/restarts limit=$MAX_RESTARTS setting=hpcrl.max_restarts ;;
        ray-start-failed | start-failed | ray-head-died | worker-died | network-error) kind=failure counter=$HPCRL_DIR/failure-restarts limit=$MAX_FAILURE_RESTARTS setting=hpcrl.max_failure_restarts ;;
        *) return 0 ;;
    esac
    # Nothing to resume from (hpcrl/planning/resume.py): a new job would train from scratch.
    if [[ $kind == limit ]]; then
        log "not continuing after $reason: "'resume none: the script declares no way to resume (set resume: marker or own if it does)'
        return 0
    fi
    if [[ -n $CONTINUED ]] || [[ -e $HPCRL_DIR/cancel ]]; then
        return 0
    fi
    CONTINUED=1
    local done_n
    done_n=$(count_file "$counter")
    if ((done_n >= limit)); then
        log "not continuing after $reason: $done_n continuations of this kind submitted already ($setting $limit)"
        return 0
    fi
    if [[ $kind == failure ]]; then
        nodes=$(blamed_nodes)
        if [[ -n $nodes ]]; then
            tr ',' '\n' <<<"$nodes" >>"$HPCRL_DIR/excluded-nodes"
        fi
        record failure "$reason ${nodes:--}"
        wait_s=$((FAILURE_BACKOFF_S * (done_n + 1)))
        log "$reason${nodes:+ on $nodes}: not the run's fault; continuing in a new job in $wait_s s${nodes:+ without $nodes}"
    fi
    if ! next=$(submit_continuation "$wait_s"); then
        log "error: sbatch of the continuation failed; resubmit $HPCRL_DIR/job.sbatch by hand"
        return 0
    fi
    next=${next%%;*}
    set_chain_owner "$next" || true
    bump_file "$counter"
    record continue "$next"
    log "continuation submitted: job $next ($kind continuation $((done_n + 1)) of at most $limit)"
    return 0
}

# The seconds until this job's time limit, as Slurm says (squeue %L: [D-]H:M:S, M:S); the
# --signal lead time when Slurm does not say.
time_left_s() {
    local left d=0 h=0 m=0 s=0
    left=$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null) || left=""
    if [[ $left =~ ^(([0-9]+)-)?([0-9]+):([0-9]+):([0-9]+)$ ]]; then
        d=${BASH_REMATCH[2]:-0} h=${BASH_REMATCH[3]} m=${BASH_REMATCH[4]} s=${BASH_REMATCH[5]}
    elif [[ $left =~ ^([0-9]+):([0-9]+)$ ]]; then
        m=${BASH_REMATCH[1]} s=${BASH_REMATCH[2]}
    else
        echo "$SIGNAL_LEAD_S"
        return 0
    fi
    echo $((((10#$d * 24 + 10#$h) * 60 + 10#$m) * 60 + 10#$s))
}

marker_stamp() { stat -c '%Y %s' -- "$CKPT_MARKER" 2>/dev/null || echo none; }

# The job's nodes Slurm now counts DOWN, comma-separated: a TERM then comes from a lost node
# (slurmctld ends the job NODE_FAIL and signals the rest), not from a preemption, and the node is
# blamed so the continuation runs without it. A node only slow to answer (`idle*`, NO_RESPOND) or
# drained is no proof: Slurm sets DOWN once it gives the node up. Nothing when sinfo does not answer.
lost_job_nodes() {
    timeout 5 sinfo -h -N -n "$SLURM_JOB_NODELIST" -t down -o %N 2>/dev/null | sort -u | paste -sd, -
}

# term_cause: why a TERM came that no cancel marker explains, from `scontrol show job`: timeout
# (Reason=TimeLimit: the limit came without its warning); cancelled when Slurm has ended the job
# (CANCELLED, or COMPLETING) for no reason of its own and no preemption (a plain `scancel`: nothing
# continues); else preempted, as before (a PreemptTime or PREEMPTED state, a TERM sent to a job Slurm
# still runs, or Slurm not answering).
term_cause() {
    local out
    if ! out=$(timeout 5 scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null); then
        echo preempted
    elif [[ $out =~ (^|[[:space:]])Reason=TimeLimit([[:space:]]|$) ]]; then
        echo timeout
    elif [[ $out =~ (^|[[:space:]])JobState=(CANCELLED|COMPLETING)[[:space:]] &&
        $out =~ [[:space:]]Reason=None[[:space:]] && ! $out =~ [[:space:]]PreemptTime=[0-9] ]]; then
        echo cancelled
    else
        echo preempted
    fi
}

# USR1 (--signal, before the time limit) or TERM/INT (scancel, preemption, the limit itself):
# chain at once (the job may be killed soon), then stop the driver. The first signal decides
# the reason; a TERM also starts Slurm's KillWait clock, which shortens any stop under way.
# After USR1 the driver runs on until its next checkpoint is complete (the framework rewrites
# CKPT_MARKER; none of the three saves on a signal) or until there is just time to stop.
on_signal() {
    local reason=$1
    if [[ $BASHPID != "$$" ]]; then
        return 0  # a child forked from this shell, not yet exec'd: the main shell handles it
    fi
    if [[ $2 != USR1 ]]; then
        term_clock
        if [[ -n $DRAIN_UNTIL ]]; then
            stop_driver "SIG$2 during the wait for a checkpoint"
        fi
    fi
    if [[ $reason == term ]]; then
        reason=preempted
        if [[ -e $HPCRL_DIR/cancel ]]; then
            reason=cancelled
        fi
    fi
    if [[ -n $STOP_REASON ]]; then
        return 0
    fi
    local lost n
    if [[ $reason == preempted ]] && lost=$(lost_job_nodes) && [[ -n $lost ]]; then
        reason=worker-died
        for n in ${lost//,/ }; do
            blame slurm-node-down "$n"
        done
        log "Slurm counts $lost of this job down (a lost node: the job ends NODE_FAIL), not a preemption"
    elif [[ $reason == preempted ]]; then
        reason=$(term_cause)
    fi
    # A watchdog that stopped beating cannot have seen a hang: the run is not continued as if it had
    # only run out of time.
    if [[ $reason == timeout ]] && watchdog_quiet 60; then
        reason=watchdog-hung
        WATCHDOG_HUNG=1
        log "the watchdog has not beaten for over 60 s at the time-limit warning:" \
            "watchdog-hung, not a time limit"
    fi
    STOP_REASON=$reason
    log "received SIG$2: stopping ($reason)"
    continue_chain "$reason"
    if ! alive "$DRIVER_PID"; then
        return 0
    fi
    if [[ -n $WATCHDOG_HUNG ]]; then
        kill_session KILL "$DRIVER_PID"  # a stopped or blocked watchdog cannot pass a TERM on
        return 0
    fi
    if [[ $2 == USR1 ]]; then
        DRAIN_STAMP=$(marker_stamp)
        DRAIN_UNTIL=$((SECONDS + $(time_left_s) - TERM_DRIVER_S - KILL_WAIT_S - STOP_RESERVE_S - 30))
        log "the driver goes on until its next checkpoint is complete ($CKPT_MARKER) or for $((DRAIN_UNTIL - SECONDS)) s"
        return 0
    fi
    stop_driver ""
    return 0
}

# stop_driver WHY: SIGTERM to the driver now; SIGKILL to its session after the grace period.
stop_driver() {
    DRAIN_UNTIL=""
    if [[ -n $1 ]]; then
        log "stopping the driver: $1"
    fi
    kill -TERM "$DRIVER_PID" 2>/dev/null || true
    if [[ -n $STOP_BY ]]; then
        STOP_DEADLINE=$((SECONDS + TERM_DRIVER_S))
    else
        STOP_DEADLINE=$((SECONDS + GRACE_S))
    fi
}

# The first TERM: from now on Slurm gives the job KILL_WAIT_S seconds.
term_clock() {
    if [[ -n $STOP_BY ]]; then
        return 0
    fi
    STOP_BY=$((SECONDS + KILL_WAIT_S - STOP_RESERVE_S))
    if [[ -n $STOP_DEADLINE ]] && ((STOP_DEADLINE > SECONDS + TERM_DRIVER_S)); then
        STOP_DEADLINE=$((SECONDS + TERM_DRIVER_S))
    fi
}

alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

# kill_session SIGNAL SID...: every process of each session (a process that left its parent's
# process group is still in the session; one that called setsid itself is not).
kill_session() {
    local sig=$1 sid
    shift
    for sid in "$@"; do
        if [[ $sid =~ ^[1-9][0-9]*$ ]]; then
            pkill -"$sig" -s "$sid" 2>/dev/null || kill -"$sig" -- "-$sid" 2>/dev/null || true
        fi
    done
}

# kill_tagged TAG: KILL every process of the job still left on this node that carries TAG (NAME=VALUE)
# in its environment. All that LEAN_ENV started carries lean_env's JOB_TAG (and, in a step's task, its
# STEP_TAG), so this also finds a grandchild that called setsid: it left the driver's session, and
# without cgroups Slurm loses it once its parent is gone. An empty TAG ends nothing.
kill_tagged() {
    local tag=${1:-} f pid
    if [[ -z $tag ]]; then
        return 0
    fi
    while IFS= read -r f; do
        pid=${f#/proc/}
        pid=${pid%/environ}
        if [[ $pid =~ ^[0-9]+$ && $pid != "$$" ]]; then
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done < <(grep -lzxF -- "$tag" /proc/[0-9]*/environ 2>/dev/null || true)
}

# On every exit: record the end first, then stop what still runs, all at once (the driver's
# session, the head's Ray, the worker step, the GPU monitor), KILL what outlives the budget
# and remove node-local files. `ray stop` is never used: it would stop every Ray cluster of
# this user on the node.
on_exit() {
    local rc=$?
    if [[ $BASHPID != "$$" ]]; then
        return "$rc"  # a subshell ending: the cleanup belongs to the main shell
    fi
    set +e
    trap - ERR
    trap '' USR1
    trap term_clock TERM INT  # Slurm's clock may start now; the cleanup goes on
    if [[ -z $END_RECORDED ]]; then
        if [[ -z $END_REASON && -z $STOP_REASON && -n $HPCRL_DIR ]] && ! probe_run_dir; then
            END_REASON=$RUN_DIR_FAILED  # a write into the run directory ended the script
        fi
        END_REASON=${END_REASON:-${STOP_REASON:-crashed}}
        rc=$(fixed_code "$END_REASON" "$rc")
        record end "$END_REASON:$rc"
        END_RECORDED=1
    fi
    continue_chain "$END_REASON"  # a failure that is not the run's fault (fail ray-start-failed, ...)
    rm -f -- "$HPCRL_DIR/driver-started-$SLURM_JOB_ID"
    # Up to END_STOP_S for everything to stop by itself (Slurm's clock, when it runs, ends it sooner):
    # each worker stops its Ray, keeps its logs and removes its node-local dirs; KILLed, it cannot.
    local by=$((SECONDS + END_STOP_S)) pid left
    kill -TERM "$DRIVER_PID" "$HEAD_PID" "$MON_PID" "${SVC_PIDS[@]}" 2>/dev/null
    # srun answers TERM with SIGKILL to the tasks, but forwards USR2: each worker stops its Ray
    # and removes its node-local directories.
    kill -USR2 "$WORKERS_PID" 2>/dev/null
    while :; do
        left=""
        for pid in "$DRIVER_PID" "$HEAD_PID" "$WORKERS_PID" "$MON_PID"; do
            if alive "$pid"; then
                left+=" $pid"
            fi
        done
        if [[ -z $left ]] || ((SECONDS >= by)) || { [[ -n $STOP_BY ]] && ((SECONDS >= STOP_BY)); }; then
            break
        fi
        sleep 0.2
    done
    if [[ -n $left ]]; then
        log "still running at the end of the stop, killed:$left"
    fi
    kill_session KILL "$DRIVER_PID" "$HEAD_PID" "${SVC_PIDS[@]}"
    kill -KILL "$WORKERS_PID" "$MON_PID" 2>/dev/null
    kill_tagged "${JOB_TAG:-}"
    # This script's own node-local directory first: the sweeps below take any directory of the job
    # left on a node for one a KILLed task could not remove, and a step may run on this node.
    if [[ -n $NODE_DIR ]]; then  # set by node_dirs, defined beside it with remove_node_dirs
        remove_node_dirs
    fi
    log "job $SLURM_JOB_ID ends: $END_REASON:$rc"
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    return 0
}

# fail REASON MESSAGE...: stop here; the EXIT trap records REASON.
fail() {
    log "error: ${*:2}"
    END_REASON=$1
    exit 1
}

# fixed_code REASON CODE: the exit code REASON always has (hpcrl/contract.py), else CODE.
fixed_code() {
    case $1 in
        ray-head-died) echo 94 ;;
        watchdog-hung) echo 87 ;;
        worker-died) echo 95 ;;
        *) echo "$2" ;;
    esac
}

# finish REASON CODE: record the end, chain a continuation if the reason allows, exit.
finish() {
    set -- "$1" "$(fixed_code "$1" "$2")"
    END_REASON=$1
    if [[ -z $END_RECORDED ]]; then
        record end "$1:$2"
        END_RECORDED=1
    fi
    continue_chain "$1"
    exit "$2"
}

# ------------------------------------------------------------------ nodes, ports, token
# Node addresses are Slurm's own (NodeAddr): `hostname` may name another network or, on a
# test cluster, the same machine for every node. One line per node: "<name> <IPv4> <slot>",
# where slot numbers the job's nodes that share one host (0 on a real cluster).
# The head is the node this batch script runs on (Slurm's BatchHost, normally the first).
job_nodes() {
    local name addr slot ip described
    mapfile -t JOB_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
    if ((${#JOB_NODES[@]} == 0)); then
        fail start-failed "scontrol show hostnames gave no node for $SLURM_JOB_NODELIST"
    fi
    if ((${#JOB_NODES[@]} != 1)); then
        fail setup-failed "this script was rendered for 1 nodes but the job has ${#JOB_NODES[@]}; re-render with --nodes ${#JOB_NODES[@]}"
    fi
    NODE_LINES=$(scontrol show node -o "$SLURM_JOB_NODELIST" | awk '
        {
            name = addr = host = ""
            for (i = 1; i <= NF; i++) {
                if ($i ~ /^NodeName=/) name = substr($i, 10)
                else if ($i ~ /^NodeAddr=/) addr = substr($i, 10)
                else if ($i ~ /^NodeHostName=/) host = substr($i, 14)
            }
            if (name != "") print name, addr, seen[host]++
        }')
    NODE_TABLE=""
    while read -r name addr slot; do
        ip=$addr
        if [[ ! $addr =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
            ip=$(getent ahostsv4 "$addr" | awk 'NR == 1 { print $1 }') || true
        fi
        if [[ -z $ip ]]; then
            fail start-failed "cannot resolve NodeAddr '$addr' of node $name to an IPv4 address"
        fi
        if ((slot > 17)); then
            fail setup-failed "more than 18 nodes of this job share the host of $name; Ray's ports are drawn in 18 disjoint sets per host"
        fi
        NODE_TABLE+="$name $ip $slot;"
    done <<<"$NODE_LINES"
    # Exported for the worker step; ';' separates nodes.
    HPCRL_NODE_TABLE=$NODE_TABLE
    described=$(awk -v RS=';' 'NF { c++ } END { print c + 0 }' <<<"$HPCRL_NODE_TABLE")
    if ((described != 1)); then
        fail start-failed "scontrol show node described $described of the job's 1 nodes"
    fi
    read -r HPCRL_HEAD_IP HEAD_SLOT < <(node_entry "$HEAD_NODE") || true
    if [[ -z ${HEAD_SLOT:-} ]]; then
        fail start-failed "head node $HEAD_NODE is missing from scontrol show node"
    fi
    export HPCRL_NODE_TABLE HPCRL_HEAD_IP
    log "job $SLURM_JOB_ID: 1 nodes, head $HEAD_NODE ($HPCRL_HEAD_IP), run dir $RUN_DIR"
}
node_entry() { awk -v RS=';' -v n="$1" '$1 == n { print $2, $3 }' <<<"$HPCRL_NODE_TABLE"; }

# Services keep the job id's block of 100 ports: +3+slot from HPCRL_PORT_BASE.
# Worker processes take ports the kernel assigns (--min/max-worker-port=0): they cannot
# collide, and a fixed range would have to hold num_cpus prestarted workers plus every actor.
job_ports() {
    export HPCRL_PORT_BASE=$((10000 + SLURM_JOB_ID % 200 * 100))
}

# Node-local files of this job on one node (Ray's temp dir, compile caches), in a directory
# only this user can enter: Ray creates its session, socket and log directories 0777, so on a
# shared node anyone could list, rename or replace them (a renamed raylet socket breaks the
# job) unless their parent is private. Ray's socket paths must fit in 107 bytes, so a long
# node-local path falls back to a private directory in /tmp for Ray, with Ray's dir inside it too
# (Ray makes its temp dir itself 0777).
# Returns 3 when the node-local path is not safe to use (another user's, or writable by others):
# the job ends node-local-unsafe, blaming no node; 4 when another user took every name mktemp
# tried: the job ends node-local-taken, blaming no node either.
node_dirs() {
    private_dir "$HPCRL_NODE_LOCAL" "hpcrl-$SLURM_JOB_ID.$1" || return
    NODE_DIR=$PRIVATE_DIR
    # Whose it is, for a later job's sweep (sweep_left) should this one die without its cleanup.
    printf '%s\n%s\n' "${SLURMD_NODENAME:-$(hostname -s)}" "$HPCRL_RUN_DIR" >"$NODE_DIR/hpcrl-owner" || return
    # JIT caches off the shared home (NFS breaks their file locks): Triton, Inductor, vLLM
    # (under XDG_CACHE_HOME), FlashInfer (appends .cache/flashinfer to its base).
    export TRITON_CACHE_DIR="$NODE_DIR/triton" TORCHINDUCTOR_CACHE_DIR="$NODE_DIR/inductor" \
        XDG_CACHE_HOME="$NODE_DIR/cache" FLASHINFER_WORKSPACE_BASE="$NODE_DIR"
}

# private_dir BASE NAME: a new directory BASE/NAME.<12 random characters> of this
# user's, mode 0700, in PRIVATE_DIR. mktemp makes it in one step, mode 0700, and takes another name when one exists:
# no one can make it first, and with 62^12 names nobody can make them all to keep the job from
# making one (three characters, 238,328 names, were all made in 13 s). Whoever may rename entries of a
# directory above it could still move it away, so BASE must pass safe_path (below) and is used by its
# physical path. A missing BASE is made (umask 022: this user's).
# Returns 3 when a level is unsafe, 4 when every name mktemp tried was taken (EEXIST: another user
# squats them; never the node's fault), 1 when the directory cannot be made.
private_dir() {
    local out old rc=0 uid mode kind
    old=$(umask)
    umask 022
    safe_path "node-local path" storage.node_local "$1" make || rc=$?
    umask "$old"
    if ((rc != 0)); then
        return "$rc"
    fi
    if ! out=$(mktemp -d -- "$SAFE_PATH/$2.XXXXXXXXXXXX" 2>&1); then
        if [[ $out == *"File exists"* ]]; then
            echo "hpcrl: error: every name mktemp tried for $SAFE_PATH/$2.XXXXXXXXXXXX was taken ($out):" \
                "another user is making this job's names first; not this node's fault" >&2
            return 4
        fi
        echo "hpcrl: error: cannot create a directory in $SAFE_PATH: $out" >&2
        return 1
    fi
    PRIVATE_DIR=$out
    read -r uid mode kind < <(stat -c '%u %a %F' -- "$PRIVATE_DIR") || true
    if [[ $uid != "$(id -u)" || $mode != 700 || $kind != directory ]]; then
        echo "hpcrl: error: $PRIVATE_DIR is not a 0700 directory of $(id -un) right after mktemp made it;" \
            "refusing to use it" >&2
        return 3
    fi
}

# safe_path WHAT SETTING PATH [make] [shared]: walk PATH from / as the kernel does, following each
# link, and check every directory reached: root's or this user's, and writable by no one else unless
# sticky (as /tmp); a link itself must be root's or this user's (in a sticky directory its owner may
# replace it). The owner of a level, or anyone who may write it, could rename what is below away and
# put a link in its place: this job's files would then go where they chose. With make, a missing level
# is made (one mkdir at a time, never through a link); with shared (storage.run_root_shared), a level
# another user owns or the group may write is warned about instead. SAFE_PATH: the physical path.
# Returns 3 (and says why on stderr) when a level is unsafe, 1 when PATH cannot be reached or made.
safe_path() {
    local what=$1 setting=$2 path=$3 make=${4:-} shared=${5:-} cur="" part target uid hops=0
    local -a todo more
    [[ $path == /* ]] || path=$PWD/$path
    IFS=/ read -r -d '' -a todo < <(printf '%s\0' "${path#/}") || true  # any byte but NUL, newlines too
    path_level / || return
    while ((${#todo[@]})); do
        part=${todo[0]}
        todo=("${todo[@]:1}")
        case $part in
            "" | .) continue ;;
            ..) cur=${cur%/*}; continue ;;
        esac
        if [[ -L $cur/$part ]]; then
            uid=$(stat -c %u -- "$cur/$part") || uid=""
            if [[ $uid != 0 && $uid != "$(id -u)" ]]; then
                echo "hpcrl: error: $cur/$part (in the $what $path) is a link of" \
                    "$(id -nu "$uid" 2>/dev/null || echo "uid $uid"), not of" \
                    "$(id -un)$( ((EUID)) && printf " or root"): its owner could point it elsewhere; refusing to use it" \
                    "(set $setting to a directory of yours)" >&2
                return 3
            elif ((++hops > 40)); then
                echo "hpcrl: error: the $what $path has more than 40 links on the way; refusing to use it" >&2
                return 1
            fi
            target=$(readlink -- "$cur/$part") || return 1
            if [[ $target == /* ]]; then
                cur=""
            fi
            IFS=/ read -r -d '' -a more < <(printf '%s\0' "${target#/}") || true
            todo=("${more[@]}" "${todo[@]}")
            continue
        fi
        if [[ -n $make && ! -e $cur/$part ]] && ! mkdir -- "$cur/$part" 2>/dev/null && [[ ! -e $cur/$part ]]; then
            echo "hpcrl: error: cannot create $cur/$part (in the $what $path)" >&2
            return 1
        fi
        if [[ -L $cur/$part ]]; then  # made by someone else between the test and the mkdir: look again
            todo=("$part" "${todo[@]}")
            continue
        fi
        cur+=/$part
        path_level "$cur" || return
    done
    SAFE_PATH=${cur:-/}
}

# path_level LEVEL: safe_path's check of one directory (its caller's WHAT, SETTING, PATH and shared).
path_level() {
    local uid mode kind who
    if ! read -r uid mode kind < <(stat -c '%u %a %F' -- "$1" 2>/dev/null); then
        echo "hpcrl: error: $1 (in the $what $path) does not exist or cannot be read" >&2
        return 1
    elif [[ $kind != directory ]]; then
        echo "hpcrl: error: $1 (in the $what $path) is a $kind, not a directory; refusing to use it" >&2
        return 3
    fi
    if [[ $uid != 0 && $uid != "$(id -u)" ]]; then
        who=$(id -nu "$uid" 2>/dev/null || echo "uid $uid")
        if [[ -z $shared ]]; then
            echo "hpcrl: error: $1 (in the $what $path) belongs to $who," \
                "not to $(id -un)$( ((EUID)) && printf " or root"): its owner could rename or replace this job's" \
                "files; refusing to use it (remove it, or set $setting to a directory of yours)" >&2
            return 3
        fi
        echo "hpcrl: warning: $1 (in the $what $path) belongs to $who: its owner could rename or replace this" \
            "job's files (accepted: storage.run_root_shared)" >&2
    fi
    if (( (8#$mode & 8#1000) )); then
        return 0  # sticky (as /tmp): nobody renames what is not theirs
    elif (( (8#$mode & 8#002) )) || { ((8#$mode & 8#020)) && [[ -z $shared ]]; }; then
        echo "hpcrl: error: $1 (in the $what $path) is mode $mode: other users could rename or replace this job's" \
            "files; refusing to use it (chmod go-w or +t it, or set $setting elsewhere)" >&2
        return 3
    elif (( (8#$mode & 8#020) )); then
        echo "hpcrl: warning: $1 (in the $what $path) is mode $mode: members of its group could rename or replace" \
            "this job's files (accepted: storage.run_root_shared)" >&2
    fi
}


# Remove what node_dirs made; twice if needed: Slurm's TERM reaches every process of the job,
# an `rm` in progress too.
remove_node_dirs() {
    if [[ -n $NODE_DIR ]]; then
        rm -rf -- "$NODE_DIR" 2>/dev/null || rm -rf -- "$NODE_DIR"
    fi
    if [[ $RAY_TMP == /tmp/hpcrl-*/ray ]]; then  # the private directory of node_dirs' /tmp fallback
        rm -rf -- "${RAY_TMP%/ray}" 2>/dev/null || rm -rf -- "${RAY_TMP%/ray}"
    fi
}

# A lean environment for Ray and the driver: open-instruct hands the driver's whole environment
# to every Ray actor (runtime_env env_vars, grpo_fast.py:2217 at e6c3044a); Ray passes it to
# each worker process as one argument, and past 128 KiB that exec fails (E2BIG) and the actor
# never starts, silently (Ray issue 47432; past 1 MiB Ray's agent refuses it with HTTP 413).
# Slurm's, PMI's, MPI's and the module system's bookkeeping stay with this script (its own
# shell variables still hold them); Ray and the driver start with `"${LEAN_ENV[@]}"`. What is
# kept and dropped: docs/render.md.
lean_env() {
    local var fn
    LEAN_ENV=(env)
    while read -r var; do
        case $var in
            SLURM_JOB_ID | SLURM_JOB_NODELIST | SLURM_JOB_NUM_NODES | SLURM_CPUS_ON_NODE | SLURM_SUBMIT_DIR | \
                SLURM_CONF | SLURM_JOB_ACCOUNT | SLURM_STEP_ID | SLURM_PROCID | SLURM_LOCALID | SLURMD_NODENAME) ;;
            SLURM_* | SLURMD_* | SBATCH_* | SRUN_* | PMI_* | PMIX_* | OMPI_* | I_MPI_* | MPICH_* | HYDRA_* | \
                LMOD_* | __LMOD_* | _LMFILES_ | _ModuleTable* | MODULEPATH_ROOT | MODULESHOME | ENV_MODULES_*)
                LEAN_ENV+=(-u "$var") ;;
        esac
    done < <(compgen -e)
    while read -r _ _ fn; do  # exported shell functions (module, ml, ...) travel as BASH_FUNC_<name>%%
        LEAN_ENV+=(-u "BASH_FUNC_${fn}%%")
    done < <(declare -Fx)
    # The tag marks every process started this way, on this node (kill_tagged ends them all);
    # env takes its options (-u) before any NAME=VALUE.
    JOB_TAG="HPCRL_JOB_TAG=$SLURM_JOB_ID.${SLURMD_NODENAME:-$(hostname -s)}"
    LEAN_ENV+=("$JOB_TAG")
    # In a step's task (lean_env step), a second tag names the step too: the task's cleanup ends its
    # own processes only. A step on the batch script's node (TRL's server, a colocated trainer on the
    # first node) shares that node's JOB_TAG with the driver, and ending by it killed the driver too.
    STEP_TAG=""
    if [[ ${1:-} == step ]]; then
        STEP_TAG="HPCRL_STEP_TAG=$SLURM_JOB_ID.${SLURM_STEP_ID:-}.${SLURMD_NODENAME:-$(hostname -s)}.$$"
        LEAN_ENV+=("$STEP_TAG")
    fi
}


# blame WHY [NODE]: this node (or NODE), in the job's blame file (a failure continuation excludes
# the nodes in it).
blame() { echo "${2:-${SLURMD_NODENAME:-$(hostname -s)}} $1" >>"$HPCRL_RUN_DIR/hpcrl/blame-$SLURM_JOB_ID"; }

# This node's limits, lean environment and private node-local directories.
head_node_setup() {
    # Open files: Ray opens a socket per worker and connection, vLLM and NCCL more: the hard limit.
    ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
    lean_env
    LEAN_BYTES=$("${LEAN_ENV[@]}" env | wc -c)
    if ((LEAN_BYTES > 100 * 1024)); then
        log "warning: the driver's environment is still $((LEAN_BYTES / 1024)) KiB after dropping Slurm, MPI and module variables; open-instruct passes it to every Ray actor, and past 128 KiB their start fails. Largest: $("${LEAN_ENV[@]}" env | awk '{ print length($0), substr($0, 1, index($0, "=") - 1) }' | sort -rn | head -3 | awk '{ printf "%s (%d B) ", $2, $1 }')"
    fi

    export HPCRL_NODE_LOCAL=/scratch/local
    local rc=0
    node_dirs "$HEAD_SLOT" || rc=$?
    if ((rc == 3)); then  # another user's directory, not this node's fault: no blame, no continuation
        fail node-local-unsafe "the node-local path on $HEAD_NODE is not safe to use (above)"
    elif ((rc == 4)); then  # another user took the names: not this node's fault either
        fail node-local-taken "another user took every name mktemp tried in the node-local path on" \
            "$HEAD_NODE"
    elif ((rc != 0)); then
        blame start-failed
        fail start-failed "cannot make this job's private node-local directory on $HEAD_NODE"
    fi
    # Once node_dirs has found the node-local path safe: what dead jobs of this user left in it.
    sweep_left_start
}

# ------------------------------------------------------------------ phases up to the driver
phase_environment() {
    phase environment
    profile_environment
    run_directory  # from here on, this log is also logs/job-<id>.log
    job_nodes
    job_ports
    head_node_setup
}

phase_stack_check() {
    phase stack_check
    # No Ray: the driver's own checks (below) are all there is.
}

phase_head() {
    phase head
    # GPU monitor on every node (exits at once on a machine without GPUs); it warns when GPUs
    # average under the cluster's idle-GPU threshold.
    python3 -m hpcrl.runtime.gpumon --out "$HPCRL_DIR/gpu-$HEAD_NODE.csv" --interval 5 --role head --detect-roles --min-mean-power-w 100 --grace-minutes 60 &
    MON_PID=$!
}

phase_services() {
    phase services
    # None in this job.
}

# ------------------------------------------------------------------ what jobs leave on a node
# keep_ray_logs NODE [SUB]: before the node-local directory goes (or a retry of `ray start` empties
# it), this node's Ray session logs (raylet.out, gcs_server.out, the workers' error files) into
# logs/ray/<job>/<node>[/SUB]/ of this job's run directory (safe_path checked it at the job's start).
keep_ray_logs() {
    local dest=$HPCRL_RUN_DIR/logs/ray/$SLURM_JOB_ID/$1${2:+/$2}
    mkdir -p -- "$dest" 2>/dev/null || return 0
    if [[ -n $RAY_TMP && -d $RAY_TMP/session_latest/logs ]]; then
        copy_ray_logs "$RAY_TMP/session_latest/logs" "$dest"
    fi
    return 0
}

# copy_ray_logs SRC DEST: the files under SRC, newest first up to the profile's ray.log_keep_mib, into
# DEST (a directory of this user's), links copied as links (cp -P), never followed.
copy_ray_logs() {
    # One cp for all the files: a Ray session has hundreds, a process each is slow on a busy node.
    find "$1/" -type f -printf '%T@\t%s\t%P\n' 2>/dev/null | sort -rn |
        awk -F '\t' -v cap=$((64 * 1048576)) '{ s += $2; if (s <= cap) print $3 }' |
        (cd -- "$1" && xargs -r -d '\n' cp -P -p --parents -t "$2" -- 2>/dev/null)
    return 0
}

# A job that dies without its cleanup (its node lost with its slurmd: Slurm ends the job and
# nothing runs there any more) leaves its node-local directories, and the Ray logs in them, on
# the node. The next job of the same user on that node sweeps them at its start: a directory
# of this user that names a job Slurm no longer runs, and this node in its hpcrl-owner file (on a
# host that several Slurm nodes share, each sweeps its own), has its Ray logs kept and is removed.
# They go into the run dir the file names (marked hpcrl-recovered, which `hpcrl report` reads) only
# when every level of that path is the user's or root's and no one else may write it (safe_path):
# a run dir that was deleted may have been made again by another user, with links to the user's
# own files in it. Otherwise into this job's run dir, logs/ray-left/<job>/<node>/, and the line says so.
# Either way into a fresh mktemp directory, renamed into place: nothing is written through a link.
# A job Slurm still has in any state but an end, another user's directory, or one without that
# file is left alone, as is everything while Slurm does not answer.
# It runs in the background, so no job waits for it, for 60 s at most (what is left then, the
# next job finds).
sweep_left_start() {
    timeout -k 2 60 bash -c "$(functions_of sweep_left); sweep_left \"\$1\"" \
        sweep_left "$HPCRL_NODE_LOCAL" &
}

# job_ended JOB: prints how Slurm says JOB ended (its end state, or "no longer known to Slurm");
# 1 while it may still run, or when Slurm does not answer.
job_ended() {
    local out
    if out=$(squeue -h -j "$1" -t all -o %T 2>&1); then
        case $out in
            BOOT_FAIL | CANCELLED | COMPLETED | DEADLINE | FAILED | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | REVOKED | SPECIAL_EXIT | TIMEOUT)
                echo "$out" ;;
            *) return 1 ;;
        esac
    elif [[ $out == *"Invalid job id"* ]]; then
        echo "no longer known to Slurm"
    else
        return 1
    fi
}

# sweep_left NODE_LOCAL [JOB]: the sweep above, on this node's NODE_LOCAL and /tmp (Ray's
# short-path fallback). With JOB (this job, whose worker step ended without its cleanup: sweep_node),
# that job's directories only, and no question to Slurm.
sweep_left() {
    local phys dir job why node rdir tmp kept here=${SLURMD_NODENAME:-$(hostname -s)}
    # node_dirs made them under the physical path, and Ray's command lines name that one.
    phys=$(cd -P -- "$1" 2>/dev/null && pwd) || phys=$1
    for dir in "$phys"/hpcrl-* /tmp/hpcrl-*; do
        if [[ ! ${dir##*/} =~ ^hpcrl-([0-9]+)\.[0-9]+(\.[[:alnum:]]+)?$ || ! -d $dir || -L $dir || ! -O $dir ]]; then
            continue
        fi
        job=${BASH_REMATCH[1]} node="" rdir=""
        { IFS= read -r node && IFS= read -r rdir; } <"$dir/hpcrl-owner" 2>/dev/null || true
        if [[ -n ${2:-} ]]; then
            [[ $job == "$2" ]] || continue
            why="a worker that could not clean up" node=${node:-$here}
        elif [[ $job == "$SLURM_JOB_ID" || $node != "$here" ]] || ! why=$(job_ended "$job"); then
            continue
        else
            why="job $job ($why), which ended without its cleanup"
        fi
        (
            exec 9<"$dir"
            flock -n 9 || exit 0  # another job's sweep on this node has it
            pkill -KILL -u "$(id -u)" -f -- "$dir/" 2>/dev/null || true
            tmp=$dir/ray
            [[ -d $tmp ]] || tmp=$dir  # the short-path fallback of a job rendered before Ray's dir went inside it
            kept=""
            if [[ -n ${2:-} ]]; then
                (RAY_TMP=$tmp && keep_ray_logs "$node")
            elif [[ -d $dir/ray || ${dir%/*} == /tmp ]]; then  # where Ray's temp dir was (not the other of the two)
                kept=$(keep_left_logs "$tmp" "$job" "$node" "$rdir")
            fi
            rm -rf -- "$dir" 2>/dev/null || rm -rf -- "$dir"
            echo "hpcrl: removed $dir, left by $why${kept:+: $kept}"
        )
    done
    return 0
}

# keep_left_logs RAY_TMP JOB NODE RUN_DIR: keep the Ray logs a dead job left (above); prints where they
# went, or that there were none.
keep_left_logs() {
    local src=$1/session_latest/logs why parent mark
    TZ=UTC0 printf -v mark '%s %(%Y-%m-%dT%H:%M:%SZ)T' "$SLURM_JOB_ID" -1
    if why=$(left_run_dir "$4" "$2" 2>&1 >/dev/null) && left_run_dir "$4" "$2" 2>/dev/null; then
        parent=$LEFT_PARENT
    else
        parent=$HPCRL_RUN_DIR/logs/ray-left/$2
        mkdir -p -- "$parent" 2>/dev/null || true
    fi
    if [[ ! -d $src ]]; then
        # None to keep: said so, and marked in the job's own run dir, where `hpcrl report` calls them lost.
        if [[ $parent == "${LEFT_PARENT:-}" ]] && store_logs "" "$parent" "$3" "$mark none"; then
            echo "it held no Ray logs to keep (marked in $STORED/)"
        else
            echo "it held no Ray logs to keep${why:+ ($why)}"
        fi
    elif ! store_logs "$src" "$parent" "$3" "$mark"; then
        echo "its Ray logs could not be kept in $parent/${why:+ ($why)}"
    elif [[ $parent == "${LEFT_PARENT:-}" ]]; then
        echo "its Ray logs kept in $STORED/"
    else
        echo "$why: its Ray logs kept in $STORED/ instead"
    fi
}

# left_run_dir RUN_DIR JOB: LEFT_PARENT, RUN_DIR/logs/ray/JOB (made when missing), when RUN_DIR is there,
# the user's, and safe_path finds every level of logs/ray/JOB safe; else 1, saying why on stderr.
left_run_dir() {
    local me msg
    me=$(id -u)
    LEFT_PARENT=""
    if [[ -z $1 || ! -e $1 ]]; then
        echo "its run dir ${1:-(not recorded)} is gone" >&2
        return 1
    elif ! msg=$(safe_path "run directory's path" hpcrl.run_root "$1/logs" 2>&1); then
        echo "its run dir $1 is not safe to write into: ${msg#hpcrl: error: }" >&2
        return 1
    elif ! safe_path "run directory's path" hpcrl.run_root "$1" 2>/dev/null ||
        [[ $(stat -c %u -- "$SAFE_PATH") != "$me" ]]; then
        echo "its run dir $1 is not $(id -un)'s" >&2
        return 1
    elif ! safe_path "run directory's path" hpcrl.run_root "$1/logs/ray/$2" make 2>/dev/null; then
        echo "its run dir $1 cannot take logs/ray/$2" >&2
        return 1
    fi
    LEFT_PARENT=$SAFE_PATH
}

# store_logs SRC PARENT NAME MARK: SRC's Ray logs (none when SRC is empty) and MARK (in hpcrl-recovered)
# into a fresh 0700 directory in PARENT, renamed to PARENT/NAME unless that exists; STORED: where they are.
store_logs() {
    local tmp
    tmp=$(mktemp -d -- "$2/.$3.XXXXXXXXXXXX") || return 1
    if [[ -n $1 ]]; then
        copy_ray_logs "$1" "$tmp"
    fi
    printf '%s\n' "$4" >"$tmp/hpcrl-recovered"
    chmod "$(printf '%o' $((8#777 & ~8#$(umask))))" -- "$tmp"
    STORED=$tmp
    # A mark that an earlier sweep found none (and nothing else) gives way to logs found now.
    if [[ -n $1 && $(ls -A -- "$2/$3" 2>/dev/null) == "hpcrl-recovered" ]] \
        && [[ $(<"$2/$3/hpcrl-recovered") == *" none" ]]; then
        rm -rf -- "${2:?}/$3"
    fi
    if mv -T -- "$tmp" "$2/$3" 2>/dev/null; then
        STORED=$2/$3
    fi
}

# ------------------------------------------------------------------ driver
# the user's training script under hpcrl's watchdog (circuit breakers: exit codes 90, 91, 92, 93, 96, 97).
WORKDIR="${HOME}"/finellama-rl
PYTHON=python
ENTRY_POINT=qwen_gsm8k_ppo_train.py

# DRIVER: the whole command. Called once $RUN_DIR is known.
driver_command() {
    DRIVER=(
        python3 -m hpcrl.runtime.watchdog --run-dir "$RUN_DIR" --heartbeat "$WATCHDOG_BEAT"
        --zero-reward-steps 10 --hang-minutes 60
        --grad-norm-steps 20 --zero-variance-steps 20 --reward-key avg_reward --loss-key loss --loss-key policy_loss --loss-key value_loss --
        "$PYTHON" "$ENTRY_POINT"
        --config configs/qwen_gsm8k_ppo_config.yaml
        --output_dir "$RUN_DIR/checkpoints"
    )
}

# The watchdog beats (sets its heartbeat file's time) every 5 s from its main loop. One
# blocked on a hung file system, or stopped, beats no more and could not see a hang: after the hang
# limit without a beat (60 s at least) the job stops the driver itself and ends
# watchdog-hung (87), never continued.
WATCHDOG_QUIET_S=3600
# watchdog_quiet S: the heartbeat is older than S seconds (1 when there is none to read).
watchdog_quiet() {
    local beat now
    beat=$(stat -c %Y -- "$WATCHDOG_BEAT" 2>/dev/null) || return 1
    printf -v now '%(%s)T' -1
    ((now - beat > $1))
}

phase_driver() {
    phase driver
    if ! cd -- "$WORKDIR"; then
        fail crashed "hpcrl.workdir $WORKDIR does not exist on $HEAD_NODE"
    fi
    if ! python3 -c 'import hpcrl.runtime.watchdog' 2>/dev/null; then
        fail crashed "hpcrl is not importable by python3 on $HEAD_NODE; install it in the job's environment (hpcrl.env_setup)"
    fi
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        fail crashed "hpcrl.python $PYTHON is not a command on $HEAD_NODE"
    fi
    if [[ ! -f $ENTRY_POINT ]]; then
        fail crashed "hpcrl.entry_point $ENTRY_POINT does not exist in $WORKDIR (a fork may keep it elsewhere)"
    fi
    export HPCRL_SAVE_STEPS=200
    WATCHDOG_BEAT=$NODE_DIR/watchdog-beat
    : >"$WATCHDOG_BEAT"
    driver_command
    printf 'hpcrl: driver:'
    printf ' %q' "${DRIVER[@]}"
    printf '\n'
    # In the background with `wait`, so the signal traps run while it works; in a session of its
    # own (the watchdog keeps the driver in it) so that a stop can kill the whole tree at once; in
    # the lean environment (above). The marker tells the workers that a dead Ray is no longer
    # retried: the driver's actors are gone with it.
    run_dir_write "$HPCRL_DIR/driver-started-$SLURM_JOB_ID" "" || true
    "${LEAN_ENV[@]}" setsid "${DRIVER[@]}" &
    DRIVER_PID=$!
    if [[ -n $STOP_REASON ]]; then  # the stop's trap ran as the driver started, before it had a pid to stop
        stop_driver "a stop arrived as the driver started"
    fi
    RAY_DIED=""
    local probe_at=$((SECONDS + 5))
    while alive "$DRIVER_PID"; do
        if [[ -n $STOP_DEADLINE || -n $RAY_DIED || -n $DRAIN_UNTIL ]]; then
            sleep 0.2 &
        else
            sleep 1 &
        fi
        wait $! || true
        if [[ -n $DRAIN_UNTIL ]]; then
            if [[ $(marker_stamp) != "$DRAIN_STAMP" ]]; then
                stop_driver "a checkpoint is complete ($CKPT_MARKER rewritten) after the time-limit warning"
            elif ((SECONDS >= DRAIN_UNTIL)); then
                stop_driver "no checkpoint since the time-limit warning, and only time to stop is left"
            fi
        fi
        # A run directory that fails (EIO, read-only) takes the driver's checkpoints with it: stop
        # it now. A full one does not: the watchdog keeps the driver running while it can.
        if ((SECONDS >= probe_at)) && [[ -z $STOP_DEADLINE ]]; then
            probe_at=$((SECONDS + 5))
            if ! probe_run_dir && [[ $RUN_DIR_FAILED == run-dir-unwritable ]]; then
                stop_driver "the run directory cannot be written"
            fi
        fi
        if [[ -z $WATCHDOG_HUNG ]] && watchdog_quiet "$WATCHDOG_QUIET_S"; then
            WATCHDOG_HUNG=1
            log "error: the watchdog has not beaten for over $WATCHDOG_QUIET_S s (blocked, on a hung file system," \
                "or stopped): it cannot see a hang; stopping the driver (watchdog-hung)"
            kill_session KILL "$DRIVER_PID"  # it may not take a TERM; the driver dies with it (PDEATHSIG)
            STOP_DEADLINE=""
        fi
        if [[ -n $STOP_DEADLINE ]] && ((SECONDS >= STOP_DEADLINE)); then
            log "the driver did not stop within its grace period: killing its session"
            kill_session KILL "$DRIVER_PID"
            STOP_DEADLINE=""
        fi
    done
    reap_driver
}

# reap_driver: the exited driver's status into DRIVER_CODE. kill -0 has failed, so bash has reaped it and
# `wait` only reads the status it kept. Bash 5.2 can lose a status it reaped while a trap ran (a TERM as the
# driver died, seen on the dev cluster with a node lost at the driver's start): `wait` then blocks on the
# job's other children (Ray's head) until Slurm's KILL, and the end line is lost. A timer interrupts it;
# a lost status is a stop's 143, or 1 (crashed) when no stop was under way.
reap_driver() {
    local timer="" pidfile="$NODE_DIR/reap-timer"
    REAP_LOST=""
    trap 'REAP_LOST=1' ALRM
    # The timer leaves this shell at once (setsid -f): a background job of its own would make bash drop the
    # dead driver's record before the wait below ("No record of process").
    setsid -f bash -c 'echo "$$" >"$2"; sleep "$3"; kill -ALRM "$1" 2>/dev/null' timer "$$" "$pidfile" 3 \
        </dev/null >/dev/null 2>&1 || true
    DRIVER_CODE=0
    wait "$DRIVER_PID" || DRIVER_CODE=$?
    local tries=20
    until read -r timer <"$pidfile" 2>/dev/null && [[ $timer =~ ^[0-9]+$ ]] || ((--tries == 0)); do
        sleep 0.05  # the timer writes its pid as it starts
    done
    if [[ $timer =~ ^[0-9]+$ ]]; then
        kill "$timer" 2>/dev/null || true
    fi
    rm -f -- "$pidfile"
    trap : ALRM  # a timer not stopped in time only interrupts a later wait, never ends this shell
    if [[ -n $REAP_LOST ]] && ((DRIVER_CODE == 142)); then  # the timer's ALRM (128 + 14) ended the wait
        DRIVER_CODE=$([[ -n $STOP_REASON ]] && echo 143 || echo 1)
        log "the driver's exit status was lost (bash reaped it in a trap); taken as $DRIVER_CODE"
    fi
}

# The end reason: a stop under way, Ray's death, else the driver's exit code (hpcrl/contract.py).
phase_stop() {
    phase stop
    local code=$DRIVER_CODE found
    if [[ -n $STOP_REASON ]]; then
        finish "$STOP_REASON" "$code"
    elif [[ -n $WATCHDOG_HUNG ]]; then
        finish watchdog-hung 87
    elif [[ $RAY_DIED == ray-head-died ]]; then
        finish ray-head-died 94
    elif [[ -n $RAY_DIED ]]; then
        finish worker-died 95
    elif [[ $RUN_DIR_FAILED == run-dir-unwritable ]] || { [[ $(reason_of "$code") == crashed ]] && ! probe_run_dir; }; then
        finish "$RUN_DIR_FAILED" "$code"
    elif [[ $(reason_of "$code") == crashed ]] && found=$(python3 -m hpcrl.runtime.classify "$HPCRL_DIR/driver.log" 2>/dev/null) &&
        [[ -n $found ]]; then
        log "the driver's log shows a network failure, not the run's own: $found"
        finish network-error "$code"
    else
        finish "$(reason_of "$code")" "$code"
    fi
}

# ------------------------------------------------------------------ main: the job's phases, in order
# Each phase logs "hpcrl: phase <name>" once; a failure ends the job through `fail` (the EXIT
# trap records the reason, chains a continuation when the reason allows, and cleans up).
# `head` is a command, hence phase_<name> for the functions.
main() {
    phase_environment  # the profile's and the config's environment, the run directory and job log, nodes, ports
    phase_stack_check  # what the job's environment must provide before anything starts
    phase_head         # this node: GPU monitor, services
    phase_services     # every service answers
    phase_driver       # the user's training script under the watchdog, until it exits
    phase_stop         # its exit code -> the end reason; record it, continue the chain when the reason allows
}

main "$@"
