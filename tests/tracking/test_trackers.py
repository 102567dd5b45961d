"""Experiment trackers (fedkt.tracking.trackers), read back with each tracker's own reader.

MLflow's ``MlflowClient`` on a local file store and TensorBoard's ``EventAccumulator`` must
give back every numeric value of every ``metrics.jsonl`` row; a suite makes one tracking
run per (arm, seed), tagged with both.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("mlflow", reason='pip install "fedkt[mlflow]"')
pytest.importorskip("tensorboard", reason='pip install "fedkt[tensorboard]"')

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

from fedkt.config import ConfigError, parse_config  # noqa: E402
from fedkt.runner import run  # noqa: E402
from fedkt.tracking import read_rows  # noqa: E402
from fedkt.tracking.trackers import Tracking  # noqa: E402
from tests.conftest import small_config  # noqa: E402


def expected_points(run_dir: Path) -> Counter:
    """(tag, step, value) of every numeric value of every metrics row."""
    points: Counter = Counter()
    for row in read_rows(run_dir / "metrics.jsonl"):
        for key, value in row.items():
            if key in ("round", "participant", "split") or isinstance(value, bool) \
                    or not isinstance(value, int | float):
                continue
            points[(f"{row['participant']}/{row['split']}/{key}", row["round"],
                    float(value))] += 1
    return points


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> Path:
    """A 2-round FedAvg run mirrored to both backends; its run folder."""
    root = tmp_path_factory.mktemp("tracked")
    cfg = small_config(root / "runs" / "tracked",
                       "tracking={backends: [mlflow, tensorboard], tags: {team: fl}}")
    run(cfg, quiet=True)
    return cfg.run_dir


def test_mlflow_file_store_holds_every_metric_row_config_and_summary(tracked):
    client = MlflowClient((tracked.parent / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("test")  # the run's name
    (mrun,) = client.search_runs([experiment.experiment_id])
    assert mrun.info.status == "FINISHED" and mrun.info.run_name == "test"
    assert {"method": "fedavg", "seed": "0", "team": "fl"}.items() <= mrun.data.tags.items()
    want = expected_points(tracked)
    assert len(want) > 40  # rounds 0-2: server, clients, train and test rows
    got: Counter = Counter()
    for key in mrun.data.metrics:
        for m in client.get_metric_history(mrun.info.run_id, key):
            got[(key, m.step, m.value)] += 1
    assert got == want  # every value of every row, and nothing else
    assert mrun.data.params["training.lr"] == "0.002"
    assert mrun.data.params["clients.models"].startswith('[{"name": "tiny-llama"')
    arts = Path(client.download_artifacts(mrun.info.run_id, "", str(tracked.parent / "dl")))
    assert (arts / "config.yaml").read_text() == (tracked / "config.yaml").read_text()
    assert (arts / "summary.md").read_text() == (tracked / "summary.md").read_text()


def test_tensorboard_event_files_hold_the_same_scalars(tracked):
    acc = EventAccumulator(str(tracked / "tensorboard"), size_guidance={"scalars": 0,
                                                                         "tensors": 0})
    acc.Reload()
    want = expected_points(tracked)
    got: Counter = Counter()
    for tag in acc.Tags()["scalars"]:
        for event in acc.Scalars(tag):
            got[(tag, event.step, event.value)] += 1
    assert sum(got.values()) == sum(want.values())
    assert {(t, s) for t, s, _ in got} == {(t, s) for t, s, _ in want}
    by_key = {(t, s): v for t, s, v in want}
    for tag, step, value in got:  # event files keep float32
        assert math.isclose(value, by_key[(tag, step)], rel_tol=1e-6, abs_tol=1e-6) or (
            math.isnan(value) and math.isnan(by_key[(tag, step)]))
    texts = {tag: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode()
             for tag in acc.Tags()["tensors"]}
    assert texts["summary/text_summary"] == (tracked / "summary.md").read_text()
    assert "tiny-llama" in texts["config/text_summary"]
    assert "team: fl" in texts["tags/text_summary"]


def test_a_missing_backend_fails_at_config_load_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r'tracking.backends: mlflow is not installed: '
                                          r'pip install "fedkt\[mlflow\]"'):
        small_config(tmp_path, "tracking=[mlflow]")
    # a client reading the server's config needs none of the server's trackers
    data = small_config(tmp_path, "tracking=[tensorboard]").model_dump(mode="json")
    data["tracking"]["backends"] = ["mlflow"]
    assert parse_config(data, check_installed=False).tracking.backends == ["mlflow"]


def test_a_resumed_run_goes_on_in_the_same_mlflow_run(tmp_path):
    cfg = small_config(tmp_path / "runs" / "r", "tracking=[mlflow]")
    cfg.run_dir.mkdir(parents=True)
    first = Tracking(cfg, cfg.run_dir, resume=False)
    first.close(False)
    again = Tracking(cfg, cfg.run_dir, resume=True)
    assert again.trackers[0].run_id == first.trackers[0].run_id
    again.close(True)
    fresh = Tracking(cfg, cfg.run_dir, resume=False)
    assert fresh.trackers[0].run_id != first.trackers[0].run_id
    fresh.close(True)


SUITE = """
name: tracked_suite
seeds: [0, 1]
tracking: [mlflow, tensorboard]
base:
  name: base
  rounds: 1
  method: {name: fedavg}
  clients: {num_clients: 2, models: [{name: tiny-llama}]}
  data:
    dataset: {name: intent_recognition}
    split: {scheme: holdout, test_size: 24}
    max_private_per_client: 16
    max_length: 64
  training: {batch_size: 8}
  runtime: {torch_threads: 1}
  eval: {batch_size: 32, plots: false, round0: false}
arms:
  fedavg: {}
  standalone: {method: {name: standalone}}
"""


def test_a_suite_logs_one_tracking_run_per_arm_and_seed_tagged_with_both(tmp_path,
                                                                         monkeypatch):
    from fedkt.evidence.suite import load_suite

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    suite = load_suite(path, tmp_path / "out")
    for cfg in suite.runs.values():  # what `fedkt suite run` starts, in-process
        run(cfg, quiet=True)
    client = MlflowClient((tmp_path / "out" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tracked_suite")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted((r.data.tags["arm"], r.data.tags["seed"], r.info.run_name) for r in runs) == [
        ("fedavg", "0", "fedavg/seed_0"), ("fedavg", "1", "fedavg/seed_1"),
        ("standalone", "0", "standalone/seed_0"), ("standalone", "1", "standalone/seed_1")]
    assert all(r.data.tags["suite"] == "tracked_suite" for r in runs)
    for r in runs:  # each tracking run holds its own run folder's rows
        arm, seed = r.data.tags["arm"], int(r.data.tags["seed"])
        want = expected_points(suite.run_dir(arm, seed))
        got = Counter((k, m.step, m.value) for k in r.data.metrics
                      for m in client.get_metric_history(r.info.run_id, k))
        assert got == want
    assert sorted(p.relative_to(tmp_path / "out" / "tensorboard").parent.as_posix()
                  for p in (tmp_path / "out" / "tensorboard").rglob("events.out.*")) == [
        "fedavg/seed_0", "fedavg/seed_1", "standalone/seed_0", "standalone/seed_1"]
