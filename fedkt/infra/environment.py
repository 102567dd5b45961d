"""Where a run's numbers were computed: library versions and the kernels' instruction set.

The same seed and config give the same numbers on one machine kind, not across kinds: a
CPU with AMX and one without run other bf16 matrix kernels (oneDNN), whose rounding moves
a fine-tuning run's final accuracy by more than a second seed does
(docs/evidence.md, "Machines"); so does torch's thread count (a bf16 matrix product split
over 1 or 2 threads sums in another order). Each run folder keeps ``environment.json``;
``summary.md`` and a suite's ``suite.md`` name it, and the reuse keys
(:mod:`fedkt.eval.reuse`) include :func:`kernels` and, read when each key is made,
:func:`numerics`.  The code counts too: :func:`source_digest` names fedkt's source files
(a label trie that lets another row compute a label's tokens rounds bf16 otherwise), and
:func:`commit` the git checkout they were imported from, so a suite folder holds runs of
one code as well as one setting (:data:`fedkt.evidence.suite.SETTING_KEYS`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["BF16_ISAS", "ENVIRONMENT_FILE", "KERNEL_ENV", "READERS", "code_label", "commit",
           "describe", "environment", "kernels", "libraries", "numerics", "source_digest",
           "setting_line", "source_files", "without_code"]

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

#: oneDNN's ISA caps (``ONEDNN_MAX_CPU_ISA``) under which its matrix kernels still have bf16
#: dot products; a lower cap (AVX2, AVX512_CORE, ...) leaves bf16 emulated, however new the
#: CPU (:func:`fedkt.infra.precision.cpu_supports_bf16`; the results page's kernel names).
BF16_ISAS = frozenset({"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512",
                       "AVX512_CORE_AMX", "AVX10_1_512_AMX", "AVX512_CORE_AMX_FP16",
                       "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT"})


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
    """Versions of torch, transformers and peft (None for one not installed): the imported
    module's where it is imported, else its installed distribution's, so a command that
    only reads runs (``fedkt suite status``) does not import transformers to name it."""
    out: dict[str, str | None] = {}
    for package in ("torch", "transformers", "peft"):
        module = sys.modules.get(package)
        if module is not None and hasattr(module, "__version__"):
            out[package] = module.__version__
            continue
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:  # a source tree on the path
            try:
                out[package] = __import__(package).__version__
            except ImportError:
                out[package] = None
    return out


_PACKAGE = Path(__file__).resolve().parents[1]  # fedkt/, not this module's fedkt/infra/

#: fedkt's packages that read finished runs (tables, verdicts, suites, power) and compute
#: nothing a run's numbers depend on: left out of :func:`source_digest`, so a change to a
#: report neither voids the reuse store nor parts a suite folder.  A test runs a job that
#: builds every kind of stored entry and checks that none of their code runs while one is.
READERS = ("evidence",)


def source_files() -> list[Path]:
    """Every fedkt source file but the readers' (the package's ``*.py``, sorted, without
    :data:`READERS`): the code a run's numbers come from, training and knowledge as well as
    evaluation."""
    return sorted(p for p in _PACKAGE.rglob("*.py")
                  if p.relative_to(_PACKAGE).parts[0] not in READERS)


@functools.cache
def source_digest() -> str:
    """SHA-256 of :func:`source_files`, each by its path in the package and its bytes: the
    same for a git checkout and a wheel of one commit, another for any edit that may move a
    number (not for one to :data:`READERS`)."""
    h = hashlib.sha256()
    for path in source_files():
        h.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def commit() -> str | None:
    """The git commit of the checkout fedkt is imported from, with ``+edited`` when a
    ``fedkt/**/*.py`` differs from that commit (or is new); None for an installed wheel, or
    where git cannot tell.  A name for people: :func:`source_digest` is what is compared."""
    root = _PACKAGE.parent
    if not (root / ".git").exists():  # a file in a git worktree, a folder in a clone
        return None

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        edited = git("status", "--porcelain", "--untracked-files=all", "--",
                     ":(glob)fedkt/**/*.py")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+edited" if edited else "")


def environment() -> dict[str, Any]:
    """Versions (fedkt, Python, :func:`libraries`), the code (:func:`source_digest`,
    :func:`commit`), :func:`kernels` and threads."""
    import torch

    from fedkt import __version__

    return {"fedkt": __version__, "python": platform.python_version(), **libraries(),
            "code": source_digest(), "commit": commit(),
            **kernels(), "torch_threads": torch.get_num_threads()}


def code_label(env: dict[str, Any]) -> str:
    """An environment's code as people read it: the digest's first 12 hex digits and, where
    recorded, its commit's first 9 (``+edited`` kept): ``21d67268e15c (commit 06b79522f)``."""
    label = str(env["code"])[:12]
    if env.get("commit"):
        head, edited, _ = str(env["commit"]).partition("+edited")
        label += f" (commit {head[:9]}{edited})"
    return label


#: The code part :func:`describe` puts before an environment line (:func:`code_label`).
_CODE_PART = re.compile(r"fedkt code [0-9a-f]+(?: \(commit [^)]*\))?; ")


def without_code(line: str) -> str:
    """An environment line (:func:`describe`'s) without its code part: what two runs of
    other commits under one kernel setting share."""
    return _CODE_PART.sub("", line)


#: The arithmetic :func:`describe` ends a line with where ``training.precision`` is auto.
_AUTO_PRECISION = re.compile(r"; precision [a-z0-9]+ \(auto\)$")


def setting_line(line: str) -> str:
    """An environment line as a kernel setting: :func:`without_code`, and without the
    arithmetic where ``auto`` chose it (the rest of the line decides it), so a run that
    recorded it and one from before it did name one setting; a pinned precision stays."""
    return _AUTO_PRECISION.sub("", without_code(line))


def describe(env: dict[str, Any]) -> str:
    """One line: versions, kernels and, where recorded, the arithmetic (``precision bf16
    (auto)``, ``precision fp32 (pinned)``): what summary.md and suite.md print."""
    flags = ", ".join(f for f in env.get("cpu_flags") or [] if f.startswith(("amx", "avx512_bf")))
    cpu = f"CPU {env.get('cpu_capability')}" + (f" ({flags})" if flags else "")
    if env.get("onednn_max_cpu_isa"):
        cpu += f", ONEDNN_MAX_CPU_ISA={env['onednn_max_cpu_isa']}"
    if env.get("cpu_model"):
        cpu += f", on {env['cpu_model']}"
    gpu = f", GPU {env['cuda']}" if env.get("cuda") else ""
    code = f"fedkt code {code_label(env)}; " if env.get("code") else ""
    how = "auto" if env.get("precision") == "auto" else "pinned"
    arithmetic = f"; precision {env['autocast']} ({how})" if env.get("autocast") else ""
    return (code + f"torch {env.get('torch')}, transformers {env.get('transformers')}, "
            f"peft {env.get('peft')}; {cpu}{gpu}{arithmetic}")
