"""Where a run's numbers were computed: library versions and the kernels' instruction set.

The same seed and config give the same numbers on one machine kind, not across kinds: a
CPU with AMX and one without run other bf16 matrix kernels (oneDNN), whose rounding moves
a fine-tuning run's final accuracy by more than a second seed does
(docs/evidence.md, "Machines"); so does torch's thread count (a bf16 matrix product split
over 1 or 2 threads sums in another order). Each run folder keeps ``environment.json``;
``summary.md`` and a suite's ``suite.md`` name it, and the reuse keys
(:mod:`fedkt.eval.reuse`) include :func:`kernels` and, read when each key is made,
:func:`numerics`.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

__all__ = ["ENVIRONMENT_FILE", "KERNEL_ENV", "describe", "environment", "kernels", "libraries",
           "numerics"]

ENVIRONMENT_FILE = "environment.json"
# CPU flags that choose which matrix kernels run (bf16/int8 paths of oneDNN and ATen)
_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16",
          "amx_int8", "amx_tile")
#: Environment variables that pick kernels or their arithmetic (ISA caps, reproducibility
#: modes, default floating-point modes of oneDNN and MKL).
KERNEL_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
              "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR", "MKL_DEBUG_CPU_TYPE",
              "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",
              "TORCH_MKLDNN_MATMUL_MIN_DIM", "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG")


@functools.cache
def _cpuinfo(field: str) -> str:
    """The first ``field`` line of /proc/cpuinfo ('' where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the capability below still tells the ISA torch uses
        return ""
    line = next((x for x in text.splitlines() if x.split(":")[0].strip() == field), "")
    return line.partition(":")[2].strip()


def _cpu_flags() -> tuple[str, ...]:
    have = set(_cpuinfo("flags").split())
    return tuple(f for f in _FLAGS if f in have)


def _cpu_model() -> str | None:
    """The CPU's model name: MKL and oneDNN may take other code paths on another vendor's
    CPU of the same instruction set."""
    return _cpuinfo("model name") or platform.processor() or None


def kernels() -> dict[str, Any]:
    """What decides which kernels compute a result on this machine: torch's CPU capability,
    the CPU's matrix-relevant flags and model name, oneDNN's ISA cap
    (``ONEDNN_MAX_CPU_ISA``) and the GPU."""
    import torch

    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_flags": list(_cpu_flags()),
            "cpu_model": _cpu_model(),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ},
            "cuda": cuda}


def numerics() -> dict[str, Any]:
    """What changes a result's numbers in this process now, beside the kernels: torch's
    intra-op and inter-op thread counts, float32 matrix precision, whether oneDNN (mkldnn)
    and TF32 are on, and the :data:`KERNEL_ENV` variables set.  Read on every call (a
    client run in this process may hold other threads than the server)."""
    import torch

    return {"intra_op_threads": torch.get_num_threads(),
            "inter_op_threads": torch.get_num_interop_threads(),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "mkldnn": bool(torch.backends.mkldnn.enabled),
            "tf32": [bool(torch.backends.cuda.matmul.allow_tf32),
                     bool(torch.backends.cudnn.allow_tf32)],
            "kernel_env": {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}}


def libraries() -> dict[str, str | None]:
    """Versions of torch, transformers and peft (None for one not installed)."""
    out: dict[str, str | None] = {}
    for package in ("torch", "transformers", "peft"):
        try:
            out[package] = __import__(package).__version__
        except ImportError:
            out[package] = None
    return out


def environment() -> dict[str, Any]:
    """Versions (fedkt, Python, :func:`libraries`), :func:`kernels` and threads."""
    import torch

    from fedkt import __version__

    return {"fedkt": __version__, "python": platform.python_version(), **libraries(),
            **kernels(), "torch_threads": torch.get_num_threads()}


def describe(env: dict[str, Any]) -> str:
    """One line: versions and kernels (what summary.md and suite.md print)."""
    flags = ", ".join(f for f in env.get("cpu_flags") or [] if f.startswith(("amx", "avx512_bf")))
    cpu = f"CPU {env.get('cpu_capability')}" + (f" ({flags})" if flags else "")
    if env.get("onednn_max_cpu_isa"):
        cpu += f", ONEDNN_MAX_CPU_ISA={env['onednn_max_cpu_isa']}"
    if env.get("cpu_model"):
        cpu += f", on {env['cpu_model']}"
    gpu = f", GPU {env['cuda']}" if env.get("cuda") else ""
    return (f"torch {env.get('torch')}, transformers {env.get('transformers')}, "
            f"peft {env.get('peft')}; {cpu}{gpu}")
