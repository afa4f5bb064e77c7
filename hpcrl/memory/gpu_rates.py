"""The rates a learner's time divides by: the GPU's peaks and its links, from the profile or defaults."""

from __future__ import annotations

from typing import NamedTuple

from hpcrl.profiles import ClusterProfile

# Datasheet link bandwidths per GPU family, GB/s per direction: (GPU-GPU inside a node, GPU-host), used
# where a profile leaves gpu.intra_node_gbs / gpu.host_link_gbs out, so an older profile still plans.
# A100 SXM4: NVLink 3 600 GB/s bidirectional, PCIe 4.0 x16; H100/H200 SXM: NVLink 4 900 GB/s
# bidirectional, PCIe 5.0 x16; GH200: NVLink-C2C 900 GB/s bidirectional to the Grace host, and 6 of its
# 18 NVLink 4 links to each of the three other superchips of a 4-GPU node (6 x 25 GB/s; inferred).
# GH200 comes first: its name contains "H200".
LINK_DEFAULTS: dict[str, tuple[float, float]] = {
    "GH200": (150.0, 450.0),
    "H200": (450.0, 64.0),
    "H100": (450.0, 64.0),
    "A100": (300.0, 32.0),
}
# Dense fp32 FLOP/s (CUDA cores) per dense bf16 tensor-core FLOP/s, datasheets: H100/H200/GH200 SXM 67 / 989,
# A100 SXM4 19.5 / 312. An fp32 x fp32 matmul runs there unless TF32 is allowed, which torch does not do by
# default (torch.backends.cuda.matmul.allow_tf32 False); the A100's ratio, the lowest, for any other GPU.
FP32_PER_BF16: dict[str, float] = {"GH200": 67 / 989, "H200": 67 / 989, "H100": 67 / 989, "A100": 19.5 / 312}
# One 200 Gb/s NIC per GPU (Berzelius: 8 HDR per 8 GPUs; Isambard-AI: 4 Slingshot per 4 GPUs).
INTER_NODE_GBS_PER_GPU = 25.0


class Rates(NamedTuple):
    """What the time terms divide by: the GPU's peaks and the links the learner uses (GB/s)."""

    bf16_tflops: float
    hbm_tbs: float
    link_gbs: float  # the learner group's collective bandwidth per GPU
    host_gbs: float
    gpu: str = ""


def link_defaults(model: str) -> tuple[float, float]:
    """(intra-node, host link) GB/s for a GPU model name; the slowest family's when none matches."""
    for family, links in LINK_DEFAULTS.items():
        if family.lower() in model.lower():
            return links
    return LINK_DEFAULTS["A100"]


def fp32_tflops(r: Rates) -> float:
    """The GPU's dense fp32 peak (no TF32), from its bf16 peak and its family's datasheet ratio."""
    ratio = next((v for family, v in FP32_PER_BF16.items() if family.lower() in r.gpu.lower()), FP32_PER_BF16["A100"])
    return r.bf16_tflops * ratio


def links_gbs(profile: ClusterProfile) -> dict[str, float]:
    """GB/s per direction per GPU inside a node, across nodes and to the host: the profile's or the defaults."""
    gpu, g = profile.gpu, profile.gpu.count_per_node
    intra, host = link_defaults(gpu.model)
    network = profile.node.inter_node_gbs or INTER_NODE_GBS_PER_GPU * g
    return {"intra_node": gpu.intra_node_gbs or intra, "inter_node": network / g, "host": gpu.host_link_gbs or host}


def rates_for(profile: ClusterProfile, n_gpus: int, learners_per_node: int | None = None) -> Rates:
    """The profile's rates for a learner group of n_gpus (spanning nodes when it cannot fit one)."""
    links = links_gbs(profile)
    per_node = learners_per_node or min(n_gpus, profile.gpu.count_per_node)
    link = links["intra_node"] if n_gpus <= per_node else min(links["intra_node"], links["inter_node"])
    return Rates(profile.gpu.bf16_tflops, profile.gpu.hbm_bandwidth_tbs, link, links["host"], profile.gpu.model)


class GpuPeaks(NamedTuple):
    """A GPU's datasheet peaks and the memory the CUDA runtime reports, for rows measured off the profiles."""

    hbm_tbs: float
    bf16_tflops: float  # dense (no sparsity)
    memory_gib: float
    source: str


# GPUs of the published vLLM rows (benchmarks/vllm_throughput): peaks from NVIDIA's datasheets; memory as
# torch reports it (nvidia-smi's total less ~0.6 GiB of CUDA runtime, as clusters/isambard-ai.yaml notes).
GPU_PEAKS: dict[str, GpuPeaks] = {
    "A100-SXM4-80GB": GpuPeaks(
        2.039, 312.0, 79.15, "NVIDIA A100 datasheet (80GB SXM: 2,039 GB/s, 312 TFLOPS bf16 dense); nvidia-smi 81920 MiB"
    ),
    "H100-SXM-80GB": GpuPeaks(
        3.35, 989.0, 79.1, "NVIDIA H100 datasheet (SXM5: 3.35 TB/s, 989 TFLOPS bf16 dense); nvidia-smi 81559 MiB"
    ),
    "H200-SXM-141GB": GpuPeaks(
        4.8,
        989.0,
        139.8,
        "NVIDIA H200 datasheet (SXM: 4.8 TB/s HBM3e, 989 TFLOPS bf16 "
        "dense); torch total_memory 139.80 GiB measured (clusters/berzelius-hopper.yaml)",
    ),
    "GB200": GpuPeaks(
        8.0,
        2500.0,
        184.4,
        "NVIDIA GB200 NVL72 datasheet, per GPU of the 72 (derived): 576 TB/s HBM3e "
        "/ 72 = 8 TB/s, 360 PFLOPS FP16/BF16 with sparsity / 72 / 2 = 2,500 TFLOPS dense; nvidia-smi "
        "189471 MiB (185.0 GiB) less ~0.6 GiB of CUDA runtime",
    ),
}
