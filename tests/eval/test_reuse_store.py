"""The reuse store (fedkt.eval.reuse) serves a result only when it was computed as this
process would compute it now (its threads, kernels' settings), and it never stops or
stalls a run: a full disk, or an entry whose builder was stopped or died, means the
result is computed here, with one warning naming the store or the entry."""

from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from fedkt.eval import reuse
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import without_timings


def _run(cfg) -> tuple[list[dict], dict[str, int]]:
    """The run's rows and what it computed and reused."""
    before = reuse.stats()
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    after = reuse.stats()
    return without_timings(rows), {k: after[k] - before[k] for k in after}


def test_a_store_filled_under_other_threads_is_computed_again_not_served(
        make_config, monkeypatch, tmp_path):
    """The store of a 1-thread run, read by a 2-thread run: every result is computed again
    (the rows are a fresh 2-thread run's, its counts too); read by a 1-thread run, every
    evaluation is served."""
    sets = ("rounds=1", "data.max_private_per_client=8")
    filled = tmp_path / "store"
    monkeypatch.setenv(reuse.ENV, str(filled))
    _, one = _run(make_config(*sets, "runtime.torch_threads=1", name="one"))
    rows_two, two = _run(make_config(*sets, "runtime.torch_threads=2", name="two"))
    monkeypatch.setenv(reuse.ENV, str(tmp_path / "empty"))
    rows_fresh, fresh = _run(make_config(*sets, "runtime.torch_threads=2", name="fresh"))
    assert one["computed"] > 0
    assert two == fresh  # nothing of the 1-thread run's was served
    assert rows_two == rows_fresh
    monkeypatch.setenv(reuse.ENV, str(filled))
    _, again = _run(make_config(*sets, "runtime.torch_threads=1", name="again"))
    assert again["computed"] == 0 and again["reused"] == one["computed"] + one["reused"]


def test_the_key_holds_the_threads_and_the_kernel_settings_read_when_it_is_made(monkeypatch):
    parts = {"items": [1, 2]}
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = reuse._key("eval", None, None, parts)
        torch.set_num_threads(2)
        two = reuse._key("eval", None, None, parts)
    finally:
        torch.set_num_threads(before)
    assert one != two
    base = reuse._key("eval", None, None, parts)
    for name, value in (("ONEDNN_MAX_CPU_ISA", "AVX2"), ("ATEN_CPU_CAPABILITY", "avx2"),
                        ("MKL_ENABLE_INSTRUCTIONS", "AVX2")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            assert reuse._key("eval", None, None, parts) != base, name
    assert reuse._key("eval", None, None, parts) == base
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert reuse._key("eval", None, None, parts) != base
    with torch.autocast("cpu", dtype=torch.float16):
        assert reuse._key("eval", None, None, parts) not in (base, one, two)


def _tensors(calls: list[int], key: str = "x") -> dict[str, torch.Tensor]:
    def compute() -> dict[str, torch.Tensor]:
        calls.append(1)
        return {"logits": torch.arange(6, dtype=torch.float32).reshape(2, 3)}

    return reuse.tensors(True, "topk", None, None, {"set": key}, compute)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("error", ["oserror", "safetensors"])
def test_a_full_disk_warns_once_naming_the_store_and_the_run_goes_on(
        reuse_store, monkeypatch, caplog, error):
    """What a full disk raises while an entry is written (OSError ENOSPC from Python's
    writes, SafetensorError from safetensors' own): the result is used, not stored, and
    the store is named in one warning however many results follow."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        if error == "oserror":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: '
                              'StorageFull, message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    if error == "oserror":  # (evaluations are gzipped JSON: Python's writes)
        monkeypatch.setattr(reuse, "_write_json", full)
    calls: list[int] = []
    with caplog.at_level(logging.WARNING, logger="fedkt"):
        for key in ("a", "b", "a"):
            assert torch.equal(_tensors(calls, key)["logits"],
                               torch.arange(6.0).reshape(2, 3))
        metrics = [reuse.evaluation(True, None, None, {"n": i}, lambda: {"accuracy": 0.5})
                   for i in range(2)]
    assert len(calls) == 3 and metrics == [{"accuracy": 0.5}] * 2
    said = _warnings(caplog)
    knowledge = [m for m in said if str(reuse_store / "knowledge") in m]
    evals = [m for m in said if str(reuse_store / "eval") in m]
    assert len(knowledge) == 1 and "No space left on device" in knowledge[0], said
    assert len(evals) == (1 if error == "oserror" else 0) and len(said) == len(knowledge) + len(
        evals), said
    assert not list((reuse_store / "knowledge").glob("*.safetensors"))


def test_an_unusable_entry_is_warned_about_once(reuse_store, caplog):
    calls: list[int] = []
    _tensors(calls)
    (entry,) = (reuse_store / "knowledge").glob("*.safetensors")
    entry.write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="fedkt"):
        _tensors(calls)
    assert len(calls) == 2
    said = _warnings(caplog)  # (it is read before taking its lock, and again after)
    assert len(said) == 1 and str(entry) in said[0], said


_HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, f"{os.getpid()}\\n".encode(), 0)
    if sys.argv[2] == "dead" and os.fork():  # the parent, named in the file, ends; its
        os._exit(0)                          # child keeps the lock (an inherited descriptor)
    print("locked", flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("holder", ["dead", "stopped", "running"])
def test_a_run_waiting_for_a_stalled_entry_says_so_and_computes_it(
        reuse_store, monkeypatch, caplog, holder):
    """Another process holds the entry's lock and will not finish it: its pid is dead (a
    child kept the lock), it is stopped (Ctrl-Z), or it runs past ``$FEDKT_REUSE_WAIT``.
    The waiting run says at WARNING what it waits for (the entry, the pid), then computes
    the result itself, at once for a dead or stopped holder."""
    monkeypatch.setenv(reuse.WAIT_ENV, "2")
    from fedkt.infra import cache

    monkeypatch.setattr(cache, "WARN_AFTER", 0.5)  # a wait this long is reported as a stall
    key = reuse._key("topk", None, None, {"set": "x"})
    entry = reuse.store("knowledge") / f"topk-{key}.safetensors"
    lock = entry.with_name(entry.name + ".lock")
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock), holder],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        pid = int(lock.read_text())
        if holder == "stopped":
            os.kill(pid, signal.SIGSTOP)
        calls: list[int] = []
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="fedkt"):
            got = _tensors(calls)
        took = time.monotonic() - start
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert calls == [1] and torch.equal(got["logits"], torch.arange(6.0).reshape(2, 3))
    said = _warnings(caplog)
    assert any(str(entry) in m and f"process {pid}" in m for m in said), said
    # a short wait stays below WARNING; one past WARN_AFTER says it still waits
    assert any(m.startswith("still waiting for") for m in said) == (holder == "running"), said
    assert (took < 1.5) if holder != "running" else (1.9 < took < 5), took
    assert not entry.exists()  # computed here, not stored under the other's lock
