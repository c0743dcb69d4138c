"""Hardware facts for back-of-the-envelope inference math: peak FLOP/s, memory bandwidth, memory size.

    gpu = ACCELERATORS["H100-SXM"]
    gpu.peak("bf16"), gpu.memory_bandwidth, gpu.memory_bytes       # 989.5e12 FLOP/s, 3.35e12 B/s, 80e9 B
    gpu.ridge_point("bf16")                                         # FLOP per byte where the roofline bends
    here = this_machine()                                           # measured: copy bandwidth, matmul rate

Conventions (they matter for the arithmetic, so they are fixed here once):

* FLOP/s are DENSE tensor-core figures. Vendor datasheets for Ampere and later print the 2:4
  structured-sparsity figure with an asterisk; the dense figure is half of it, which is what a normal
  (dense) matmul can reach. Integer rates (int8) are OP/s, listed beside the FLOP/s.
* Bandwidth is in bytes per second, decimal (1 TB/s = 1e12 B/s), as datasheets print it.
* Memory size is the datasheet's "GB" read as decimal gigabytes (80 GB -> 80e9 bytes). The chips
  usually report a little more (HBM stacks come in binary sizes; check `nvidia-smi` or
  torch.cuda.get_device_properties on a real one); the decimal figure is the conservative one, and
  all course answers use it.
* Measured numbers (`this_machine`) are what a simple PyTorch program reaches, not a hardware peak.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

from minigpt.timing import CPU_THREADS, compare

THIS_MACHINE = "this machine"       # the name of the measured entry, in tables and plots

TB = 1e12
GB = 1e9


@dataclass(frozen=True)
class Accelerator:
    """One accelerator's roofline facts.

    peak_flops: dense FLOP/s (OP/s for int8) per precision name ("fp32", "tf32", "bf16", "fp16", "fp8", "int8").
    memory_bandwidth: bytes/s of its main memory (HBM / GDDR / DRAM).
    memory_bytes: capacity of that memory in bytes.
    """

    name: str
    peak_flops: dict[str, float]
    memory_bandwidth: float
    memory_bytes: int
    source: str
    notes: str = ""
    measured: bool = False

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s at `precision`.

        A chip without bf16 (the T4) answers "bf16" with its fp16 figure, the format it would run in.
        """
        if precision in self.peak_flops:
            return self.peak_flops[precision]
        if precision == "bf16" and "fp16" in self.peak_flops:
            return self.peak_flops["fp16"]
        raise KeyError(f"{self.name} has no {precision!r} figure (it has {sorted(self.peak_flops)}); "
                       "pick one of those precisions")

    def precisions(self) -> list[str]:
        """Precisions `peak` answers for ("bf16" included where fp16 stands in for it)."""
        names = list(self.peak_flops)
        if "bf16" not in names and "fp16" in names:
            names.append("bf16")
        return names

    def ridge_point(self, precision: str) -> float:
        """FLOP per byte where compute time equals memory time: peak / bandwidth."""
        return self.peak(precision) / self.memory_bandwidth


# Vendor datasheet figures. "x / 2": the datasheet prints the sparsity figure (x); dense is half.
# Dense Hopper SXM compute (H100 SXM and H200 share the chip): the datasheets print the sparsity
# figures, so the tensor-core rates below are half of them.
HOPPER_SXM_FLOPS = {"fp32": 67 * TB, "tf32": 989 / 2 * TB, "bf16": 1979 / 2 * TB, "fp16": 1979 / 2 * TB,
                    "fp8": 3958 / 2 * TB, "int8": 3958 / 2 * TB}

ACCELERATORS: dict[str, Accelerator] = {
    "A100-SXM-80GB": Accelerator(
        "A100-SXM-80GB",
        # NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
        # nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), column "A100 80GB SXM":
        # BF16/FP16 312 TF (624 sparse), TF32 156 TF, FP32 19.5 TF, INT8 624 TOPS (1248 sparse); no FP8.
        {"fp32": 19.5 * TB, "tf32": 156 * TB, "bf16": 312 * TB, "fp16": 312 * TB, "int8": 624 * TB},
        memory_bandwidth=2_039 * GB,            # "2,039 GB/s" HBM2e
        memory_bytes=int(80 * GB),              # "80GB HBM2e"
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column)",
        notes="Ampere: no fp8 tensor cores"),
    "H100-SXM": Accelerator(
        "H100-SXM",
        # NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/), "H100 SXM" column:
        # BF16/FP16 1,979 TF*, FP8 3,958 TF*, INT8 3,958 TOPS*, TF32 989 TF*, FP32 67 TF; * = with sparsity.
        dict(HOPPER_SXM_FLOPS),
        memory_bandwidth=3.35 * TB,             # "3.35TB/s" HBM3
        memory_bytes=int(80 * GB),              # "80GB"
        source="NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column)"),
    "H100-PCIe": Accelerator(
        "H100-PCIe",
        # NVIDIA H100 Tensor Core GPU datasheet (2022 edition, PB-11133 product brief), "H100 PCIe" column:
        # BF16/FP16 1,513 TF*, FP8 3,026 TF*, INT8 3,026 TOPS*, TF32 756 TF*, FP32 51 TF; * = with sparsity.
        {"fp32": 51 * TB, "tf32": 756 / 2 * TB, "bf16": 1513 / 2 * TB, "fp16": 1513 / 2 * TB,
         "fp8": 3026 / 2 * TB, "int8": 3026 / 2 * TB},
        memory_bandwidth=2.0 * TB,              # "2TB/s" HBM2e
        memory_bytes=int(80 * GB),              # "80GB"
        source="NVIDIA H100 Tensor Core GPU datasheet, 2022 (H100 PCIe column)"),
    "H200": Accelerator(
        "H200",
        # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/), "H200 SXM" column:
        # same compute as H100 SXM (BF16/FP16 1,979 TF*, FP8 3,958 TF*, INT8 3,958 TOPS*; * = with sparsity).
        dict(HOPPER_SXM_FLOPS),
        memory_bandwidth=4.8 * TB,              # "4.8TB/s" HBM3e
        memory_bytes=int(141 * GB),             # "141GB"
        source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column)"),
    "L4": Accelerator(
        "L4",
        # NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4/):
        # BF16/FP16 242 TF*, FP8 485 TF*, INT8 485 TOPS*, TF32 120 TF*, FP32 30.3 TF; * = with sparsity.
        {"fp32": 30.3 * TB, "tf32": 120 / 2 * TB, "bf16": 242 / 2 * TB, "fp16": 242 / 2 * TB,
         "fp8": 485 / 2 * TB, "int8": 485 / 2 * TB},
        memory_bandwidth=300 * GB,              # "300GB/s" GDDR6
        memory_bytes=int(24 * GB),              # "24GB"
        source="NVIDIA L4 Tensor Core GPU datasheet"),
    "T4": Accelerator(
        "T4",
        # NVIDIA T4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/tesla-t4/):
        # "Mixed precision (FP16/FP32) 65 TFLOPS", "INT8 130 TOPS", "Single precision 8.1 TFLOPS".
        # Turing has no bf16 and no sparsity; these are the dense figures as printed.
        {"fp32": 8.1 * TB, "fp16": 65 * TB, "int8": 130 * TB},
        memory_bandwidth=320 * GB,              # "320+ GB/s" GDDR6
        memory_bytes=int(16 * GB),              # "16 GB GDDR6"
        source="NVIDIA T4 Tensor Core GPU datasheet",
        notes="Turing has no bf16: its fp16 tensor-core figure (65 TFLOP/s) stands in for bf16; no fp8"),
    "RTX-4090": Accelerator(
        "RTX-4090",
        # NVIDIA Ada GPU architecture whitepaper (v2.01), appendix table for GeForce RTX 4090:
        # peak BF16/FP16 tensor TFLOPS with FP32 accumulate 165.2 (330.4 sparse), FP8 with FP32 accumulate
        # 330.3 (660.6 sparse), INT8 660.6 TOPS (1321.2 sparse), FP32 82.6 TFLOPS.
        {"fp32": 82.6 * TB, "bf16": 165.2 * TB, "fp16": 165.2 * TB, "fp8": 330.3 * TB, "int8": 660.6 * TB},
        memory_bandwidth=1_008 * GB,            # "1008 GB/sec" GDDR6X
        memory_bytes=int(24 * GB),              # "24 GB"
        source="NVIDIA Ada GPU architecture whitepaper v2.01 (GeForce RTX 4090 column)",
        notes="consumer card; fp16/bf16 figure is with fp32 accumulation (fp16 accumulation is twice as fast)"),
}


def get_accelerator(name: str) -> Accelerator:
    """ACCELERATORS[name] with a clear error for an unknown name."""
    try:
        return ACCELERATORS[name]
    except KeyError:
        raise KeyError(f"unknown accelerator {name!r}; known: {sorted(ACCELERATORS)} "
                       f"(use this_machine() for the measured one)") from None


def device_accelerator(device_name: str) -> Accelerator | None:
    """The ACCELERATORS entry whose datasheet describes a GPU named `device_name` (torch.cuda.get_device_name), or
    None where the table has no column for it. Variants of one chip differ: an H100 PCIe has 76% of the SXM's
    tensor-core rate and 60% of its bandwidth, so "H100" alone is not enough ("NVIDIA H100 80GB HBM3" is the SXM,
    "NVIDIA H100 PCIe" the PCIe card; the H100 NVL has no column here)."""
    name = device_name.upper().replace("-", " ")
    if "H100" in name:
        if "PCIE" in name:
            return ACCELERATORS["H100-PCIe"]
        return ACCELERATORS["H100-SXM"] if "HBM3" in name or "SXM" in name else None
    if "H200" in name:
        return ACCELERATORS["H200"] if "NVL" not in name else None
    if "A100" in name:
        return ACCELERATORS["A100-SXM-80GB"] if "SXM" in name and "80GB" in name else None
    if "RTX 4090" in name:
        return ACCELERATORS["RTX-4090"]
    words = name.split()
    for short in ("L4", "T4"):
        if short in words:
            return ACCELERATORS[short]
    return None


def _device(device: str | torch.device | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def measure_copy_bandwidth(n_bytes: int = 256 * 2**20, *, device: str | torch.device | None = None,
                           repeats: int = 5) -> float:
    """Bytes/s of a large tensor copy, counting bytes read + bytes written (2 * n_bytes per copy).

    The buffer must be much larger than the caches (tens of MB on a CPU or GPU) to measure main memory.
    """
    if n_bytes < 4:
        raise ValueError(f"n_bytes must be at least 4, got {n_bytes}")
    dev = _device(device)
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    t = compare({"copy": lambda: dst.copy_(src)}, warmup=1, repeats=repeats, device=dev)["copy"].median
    return 2 * src.numel() * src.element_size() / t


def measure_matmul_rate(n: int = 1024, dtype: torch.dtype = torch.float32, *,
                        device: str | torch.device | None = None, repeats: int = 5) -> float:
    """FLOP/s of an (n x n) @ (n x n) matmul: 2 n^3 FLOP (one multiply and one add per term)."""
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    dev = _device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=dev).to(dtype)
    b = torch.randn(n, n, generator=gen, device=dev).to(dtype)
    t = compare({"matmul": lambda: a @ b}, warmup=1, repeats=repeats, device=dev)["matmul"].median
    return 2 * n**3 / t


def _memory_bytes(dev: torch.device) -> int:
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def this_machine(*, device: str | torch.device | None = None, copy_bytes: int = 256 * 2**20,
                 matmul_n: int = 1024, bf16_matmul_n: int | None = None, repeats: int = 5) -> Accelerator:
    """Measure this machine (the GPU if there is one, else the CPU) and return it as an Accelerator.

    peak_flops holds the measured fp32 and bf16 matmul rates, memory_bandwidth the measured copy
    bandwidth; both are achieved rates, lower than the hardware's peak.
    """
    dev = _device(device)
    what = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor() or platform.machine())
    rates = {"fp32": measure_matmul_rate(matmul_n, torch.float32, device=dev, repeats=repeats),
             "bf16": measure_matmul_rate(bf16_matmul_n or matmul_n, torch.bfloat16, device=dev, repeats=repeats)}
    bandwidth = measure_copy_bandwidth(copy_bytes, device=dev, repeats=repeats)
    threads = f", {CPU_THREADS} threads" if dev.type == "cpu" else ""
    return Accelerator(THIS_MACHINE, rates, memory_bandwidth=bandwidth, memory_bytes=_memory_bytes(dev),
                       source=f"measured on {dev.type} ({what}{threads}) with minigpt.costmodel.hardware",
                       notes="measured: large-tensor copy and square matmul, medians", measured=True)
