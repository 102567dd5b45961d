"""SIGKILL `fedkt run` mid-round, `fedkt resume` it: the result equals an uninterrupted run.

The server is killed (a) reliably inside round 2 after the clients replied and the
round's metrics rows were written, but before its checkpoint (``fedkt run`` started
through ``python -m tests.support.paused_run 2``, which pauses there, see tests/support/paused_run.py),
and (b) for FedAvg once more, as soon as the resumed run has checkpointed round 2 (so
somewhere in round 3, wherever it happens to be).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file

from fedkt.runtime.base import default_state_root as client_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import RunRecorder, read_rows, without_timings
from fedkt.tracking.folder import SERVER_STATE
from tests.conftest import ROOT
from tests.support.paused_run import PAUSE_LINE


def _fedkt(*args: str, pause: int | None = None) -> subprocess.Popen:
    """``fedkt ARGS -q`` in a child process; ``pause``: it stops in that round before the
    checkpoint (and says so on stderr) until killed."""
    main = ["fedkt.cli"] if pause is None else ["tests.support.paused_run", str(pause)]
    return subprocess.Popen([sys.executable, "-m", *main, *args, "-q"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def _latest(run_dir) -> int:
    path = run_dir / "checkpoints" / "latest.json"
    try:
        return json.loads(path.read_text())["round"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def _kill_when_paused(proc: subprocess.Popen, run_dir) -> None:
    """Wait for the pause's line on stderr, check where the run stands, SIGKILL it."""
    seen = []
    for line in proc.stderr:  # blocks until the server pauses (or exits)
        seen.append(line)
        if PAUSE_LINE.format(rnd=2) in line:
            break
    else:
        pytest.fail(f"fedkt run ended (rc {proc.wait()}) without pausing:\n{''.join(seen)}")
    assert _latest(run_dir) == 1  # round 2 not checkpointed ...
    assert any(r["round"] == 2 for r in read_rows(run_dir / "metrics.jsonl"))  # ... but logged
    _kill(proc)


def _numbers(rows):
    return without_timings(rows)


# The standalone case (the killed round's client state on disk, read back by no one) is
# what the conformance test checks in-process for every method: it runs with -m slow.
@pytest.mark.parametrize("method, rounds, second_kill", [
    # 32 s on an idle 2-core AVX2 host (2026-12-03); tests/runtime/test_fault_paths.py keeps a resume
    pytest.param("fedavg", 4, True, marks=pytest.mark.slow),
    pytest.param("standalone", 2, False, marks=pytest.mark.slow)])
def test_sigkill_mid_round_then_resume_equals_clean_run(make_config, tmp_path, method, rounds,
                                                        second_kill):
    cfg = make_config(f"rounds={rounds}", method=method, name="killed")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(cfg.to_yaml())
    run_dir = cfg.run_dir

    proc = _fedkt("run", str(config_file), pause=2)
    _kill_when_paused(proc, run_dir)
    if method == "standalone":  # the killed round's client state is on disk
        assert list((client_state_root(cfg) / "client_0").glob("*.r00002s*"))

    if second_kill:
        proc = _fedkt("resume", str(run_dir))
        deadline = time.monotonic() + 240
        while _latest(run_dir) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, f"resume ended early: {proc.stderr.read()}"
        _kill(proc)
        assert 2 <= _latest(run_dir) < rounds

    done = subprocess.run([sys.executable, "-m", "fedkt.cli", "resume", str(run_dir), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr

    clean_cfg = make_config(f"rounds={rounds}", method=method, name="clean")
    clean = run_job(clean_cfg, LocalTransport(client_state_root(clean_cfg)), quiet=True)
    resumed = read_rows(run_dir / "metrics.jsonl")

    keys = Counter((r["round"], r["participant"], r["split"]) for r in resumed)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    # Round 0 (eval.round0, the zero-shot evaluation) and every trained round, once each.
    assert sorted({r["round"] for r in resumed}) == list(range(0, rounds + 1))
    last = [r for r in clean if r["round"] == rounds]
    assert any(r["split"] == "test" for r in last)
    assert _numbers([r for r in resumed if r["round"] == rounds]) == _numbers(last)
    assert _numbers(resumed) == _numbers(clean)

    final = RunRecorder(run_dir, resume=True).checkpoint_dir(rounds) / SERVER_STATE
    a = load_file(str(final))
    b = load_file(str(RunRecorder(clean_cfg.run_dir, resume=True).checkpoint_dir(rounds)
                      / SERVER_STATE))
    assert a.keys() == b.keys() and (a or method == "standalone")
    assert all(torch.equal(a[k], b[k]) for k in a)
