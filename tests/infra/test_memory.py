"""Freed heap goes back to the OS when a run's outermost phase ends (fedkt.infra.memory)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fedkt.infra import timing
from fedkt.infra.memory import trim_available

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
