"""What a training process really runs on, described for a reader of its record: the device, the
GPU's name (or the CPU model), the precision autocast uses, torch's thread count and the OpenMP
wait policy its threads were started with."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import torch


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe_device(device: torch.device, autocast_dtype: torch.dtype | None) -> dict[str, str]:
    """device ("cuda:0", "cpu"), name, precision ("fp32" without autocast, else its dtype's
    short name), threads and omp_wait_policy, as text."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        device, name = torch.device("cuda", index), torch.cuda.get_device_name(index)
    else:
        name = cpu_model()
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[autocast_dtype]
    return {
        "device": str(device),
        "name": name,
        "precision": precision,
        "threads": str(torch.get_num_threads()),
        # OpenMP read it when torch loaded, from this same environment.
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "OpenMP default"),
    }
