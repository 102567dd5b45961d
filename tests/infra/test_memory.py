"""Freed heap goes back to the OS when a run's outermost phase ends (fedkt.infra.memory);
``import fedkt`` bounds oneDNN's caches of compiled bf16 kernels (fedkt/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedkt import KERNEL_CACHES
from fedkt.infra import timing
from fedkt.infra.memory import trim_available
from fedkt.infra.precision import cpu_supports_bf16

# Frees a 16 MB block (glibc then raises its mmap threshold to 16 MB), allocates 300 MB
# in 1 MB blocks with a small live object after each, frees the blocks: the holes stay
# in the heap until release_memory. Prints RSS (MB) after each step.
_SCRIPT = """
import numpy as np
from fedkt.infra.memory import release_memory
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
big = np.ones(16 * 2**20 // 8); del big
before = rss()
blocks, pins = [], []
for _ in range(300):
    blocks.append(np.ones(2**20 // 8)); pins.append(bytearray(2000))
del blocks
held = rss()
gave = release_memory()
print(before, held, rss(), gave)
"""


@pytest.mark.skipif(not trim_available(), reason="malloc_trim needs glibc on Linux")
def test_release_memory_gives_freed_heap_back():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    before, held, after = (float(x) for x in out[:3])
    assert held - before > 250  # freed, but still the process's
    assert held - after > 250 and out[3] == "True"  # given back


def test_only_the_outermost_phase_releases(monkeypatch):
    calls = []
    monkeypatch.setattr(timing, "release_memory", lambda: calls.append(1))
    with timing.phase("train"):
        with timing.phase("eval"):  # counted as train, released with it
            pass
        assert calls == []
    assert calls == [1]
    with pytest.raises(RuntimeError), timing.phase("eval"):
        raise RuntimeError("a failed phase still gives its memory back")
    assert calls == [1, 1]


def test_it_can_be_turned_off():
    env = {**os.environ, "FEDKT_MALLOC_TRIM": "0"}
    out = subprocess.run([sys.executable, "-c", "from fedkt.infra.memory import trim_available,"
                          " release_memory; print(trim_available(), release_memory())"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


# 380 bf16 products of as many shapes and their backward (a run's batches of changing
# lengths, in small): prints the MB the process grew by, and the two cache sizes it ran with.
_SHAPES = """
import os, fedkt, torch
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 1e6
torch.set_num_threads(1)
w = torch.randn(256, 256, dtype=torch.bfloat16, requires_grad=True)
x = torch.randn(400, 256, dtype=torch.bfloat16)
for n in range(1, 20):
    (x[:n] @ w).sum().backward()
start = rss()
for n in range(20, 400):
    (x[:n] @ w).sum().backward()
print(rss() - start, os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY"),
      os.environ.get("LRU_CACHE_CAPACITY"))
"""


def _unset() -> dict[str, str]:
    """This environment without the cache sizes (``import fedkt`` here set them)."""
    return {k: v for k, v in os.environ.items() if k not in (*KERNEL_CACHES, "FEDKT_KERNEL_CACHE")}


def _grown(**env: str) -> tuple[float, list[str]]:
    out = subprocess.run([sys.executable, "-c", _SHAPES], env={**_unset(), **env},
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    return float(out[0]), out[1:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.skipif(not cpu_supports_bf16(), reason="bf16 products go through oneDNN only on "
                    "a CPU with native bf16")
def test_fedkt_bounds_onednns_kernel_cache():
    bounded, size = _grown()
    default, unset = _grown(FEDKT_KERNEL_CACHE="0")
    assert (size, unset) == (["64", "64"], ["None", "None"])
    assert default > 200 and bounded < default / 3  # measured: 552 MB against 55
    one, _ = _grown(FEDKT_KERNEL_CACHE="0", ONEDNN_PRIMITIVE_CACHE_CAPACITY="64")
    assert one > 2 * bounded  # oneDNN's alone is not enough: ideep's keeps its kernels


def test_a_kernel_cache_size_the_user_chose_is_kept():
    out = subprocess.run([sys.executable, "-c", "import os, fedkt; print(*(os.environ[k] for "
                          f"k in {KERNEL_CACHES!r}))"],
                         env={**_unset(), "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512"},
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["512", "64"]
