# Source on the GPU machine from the repo root: installs the carried DeepSpeed and its missing deps.
#   . benchmarks/device_setup.sh
# The first time, DeepSpeed's sdist is built into a wheel (pure Python, DS_BUILD_OPS=0) and a
# copy goes to $OUT so later calls can carry the wheel instead.
export TORCH_CUDA_ARCH_LIST=9.0 DS_BUILD_OPS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
W=benchmarks/.whl
if ! ls $W/deepspeed-*.whl >/dev/null 2>&1; then
  python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w $W $W/deepspeed-*.tar.gz || return 1
  [ -n "$OUT" ] && cp $W/deepspeed-*.whl "$OUT"/
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $W/*.whl || return 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 - <<'PY'
import importlib, torch
v = {m: getattr(importlib.import_module(m), "__version__", "?") for m in ("torch", "transformers", "peft", "deepspeed", "pydantic")}
try:
    import flash_attn; v["flash_attn"] = flash_attn.__version__
except Exception as e:
    v["flash_attn"] = f"absent ({type(e).__name__})"
v["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print("VERSIONS", v, flush=True)
PY
