"""A full disk (ENOSPC) while a run writes: an optional output (the plots, summary.md, a
tracker's mirror) that cannot be written is a warning naming its path, and the run goes
on; an essential file (metrics.jsonl, a checkpoint) stops the run with an error naming
its path. Each write is made to raise the real ``OSError(ENOSPC)``."""

from __future__ import annotations

import errno
import os

import pytest
import torch

from fedkt.runner import run
from fedkt.tracking import read_rows
from fedkt.tracking.checkpoint import write_checkpoint
from fedkt.tracking.folder import METRICS_FILE, SERVER_STATE, RunRecorder
from tests.conftest import small_config


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_optional_outputs_on_a_full_disk_warn_by_path_and_the_run_finishes(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from matplotlib.figure import Figure
    from torch.utils.tensorboard import SummaryWriter

    import fedkt.tracking.folder as folder

    monkeypatch.setattr(Figure, "savefig", _full)
    monkeypatch.setattr(SummaryWriter, "add_scalar", _full)
    monkeypatch.setattr(SummaryWriter, "add_text", _full)
    real = folder.atomic_write

    def summary_full(path, data, **kw):
        if path.name == "summary.md":
            _full()
        return real(path, data, **kw)

    monkeypatch.setattr(folder, "atomic_write", summary_full)
    cfg = small_config(tmp_path / "run", "rounds=1", "eval.plots=true",
                       "tracking={backends: [tensorboard]}")
    with pytest.warns(RuntimeWarning) as caught:
        run(cfg, quiet=True)
    text = "\n".join(str(w.message) for w in caught)
    assert str(cfg.run_dir / "plots") in text and ".png" in text, text
    assert str(cfg.run_dir / "summary.md") in text, text
    assert "tensorboard" in text and str(cfg.run_dir / "tensorboard") in text, text
    assert "No space left on device" in text
    rows = read_rows(cfg.run_dir / METRICS_FILE)
    assert any(r.get("participant") == "server" and r.get("round") == 1 for r in rows)
    assert (cfg.run_dir / "checkpoints" / "latest.json").is_file()


def test_metrics_on_a_full_disk_stop_the_run_naming_the_file(tmp_path, monkeypatch):
    recorder = RunRecorder(tmp_path / "run")
    real_open = type(recorder.metrics_path).open

    def open_full(self, *args, **kwargs):
        if self.name == METRICS_FILE:
            _full()
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(type(recorder.metrics_path), "open", open_full)
    with pytest.raises(OSError, match=rf"{recorder.metrics_path}.*No space left"):
        recorder.log({"round": 1, "participant": "server", "loss": 1.0})


def test_a_checkpoint_on_a_full_disk_stops_the_run_naming_the_file(tmp_path, monkeypatch):
    import fedkt.tracking.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "save_file", _full)
    recorder = RunRecorder(tmp_path / "run")
    with pytest.raises(OSError, match=rf"{recorder.checkpoint_dir(1) / SERVER_STATE}.*No space"):
        write_checkpoint(recorder, {"w": torch.ones(2)}, {}, 1)
