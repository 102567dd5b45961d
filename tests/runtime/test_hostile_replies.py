"""A hostile client: its reply's runtime fields (envelope, metrics, timings, predictions,
error text, example count, size) are garbage or forged.

Each case edits client 1's real reply (from the recorded fedavg run, as in
``test_malformed_replies.py``) and runs the real server on it: the client is excluded
with a reason naming the client and the field, the run finishes with the other two
clients, and no server row changes (the rows of the clean run, less client 1's).
"""

from __future__ import annotations

import gzip
import json
import re
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from fedkt.eval import predictions
from fedkt.federated.payload import Payload, dumps
from fedkt.runtime.base import RoundError
from fedkt.runtime.envelope import ENVELOPE, ERROR, PREDICTIONS
from fedkt.runtime.job import run_job
from fedkt.tracking import without_timings
from tests.runtime.test_malformed_replies import (
    BAD,
    assert_excluded,
    metrics_file_rows,
    tampered_run,
)
from tests.support.trust_helpers import ReplayTransport, recorded_run, tiny_config


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def setting(field: str, value) -> callable:
    def tamper(p: Payload) -> Payload:
        p[field] = value
        return p

    return tamper


def envelope(**values) -> callable:
    def tamper(p: Payload) -> Payload:
        p[ENVELOPE] = {**p[ENVELOPE], **values}
        return p

    return tamper


def forged_metrics(p: Payload) -> Payload:
    p["metrics"] = {**p.get("metrics", {}), "test/participant": "server", "test/accuracy": 1.0,
                    "train/round": 99}
    return p


def bomb(size: int) -> torch.Tensor:
    """A gzip stream of ``size`` zero bytes (about size / 1000 bytes compressed)."""
    blob = gzip.compress(b"0" * size, compresslevel=9, mtime=0)
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()


def big_reply(p: Payload) -> bytes:
    p["padding"] = torch.zeros(300_000, dtype=torch.uint8)
    return dumps(p)


# (tamper, the regex the exclusion reason must match); every attack on the runtime's fields
ATTACKS = {
    "metrics_list": (setting("metrics", [1, 2, 3]),
                     r"client 1: field 'metrics' should be a mapping of names to numbers, got "
                     r"list"),
    "metrics_text": (setting("metrics", "accuracy=1"), r"client 1: field 'metrics' .* got str"),
    "metric_value_text": (setting("metrics", {"test/accuracy": "1.0"}),
                          r"client 1: field 'metrics'\['test/accuracy'\] should be a finite "
                          r"number"),
    "metric_value_dict": (setting("metrics", {"train/loss": {"a": 1}}),
                          r"client 1: field 'metrics'\['train/loss'\] should be a finite number"),
    "metric_huge_int": (setting("metrics", {"train/loss": 10**400}),
                        r"client 1: field 'metrics'\['train/loss'\] should be a finite number"),
    "metric_bad_name": (setting("metrics", {"test/" + "x" * 500: 1.0}),
                        r"client 1: field 'metrics': metric name .* is not 'split/name'"),
    "metric_too_many": (setting("metrics", {f"train/m{i}": 1.0 for i in range(300)}),
                        r"runtime.limits.metrics = 256"),
    "forged_row_keys": (forged_metrics,
                        r"client 1: field 'metrics': metric 'test/participant' would overwrite "
                        r"the server's row key 'participant'"),
    "envelope_list": (setting(ENVELOPE, [1, 2]), r"client 1: field '_fedkt' should be a mapping"),
    "envelope_text": (setting(ENVELOPE, "x"), r"client 1: field '_fedkt' should be a mapping"),
    "envelope_extra_key": (envelope(participant="server"),
                           r"client 1: field '_fedkt' has unexpected keys \['participant'\]"),
    "seconds_inf": (envelope(seconds="inf"),
                    r"client 1: field '_fedkt'\['seconds'\] should be a finite number, got inf"),
    "seconds_negative": (envelope(cpu=-5.0), r"client 1: field '_fedkt'\['cpu'\] = -5 is "
                                             r"outside \[0, 1e\+07\]"),
    "seconds_list": (envelope(compute=[1.0]),
                     r"client 1: field '_fedkt'\['compute'\] should be a finite number"),
    "timings_list": (envelope(timings=[1, 2]),
                     r"client 1: field '_fedkt'\['timings'\] should be a mapping"),
    "timings_not_seconds": (envelope(timings={"train/accuracy": "1.0"}),
                            r"'train/accuracy' is not a '\*_seconds' timing"),
    "timings_forged": (envelope(timings={"wall_time": "0"}),
                       r"would overwrite the server's row key 'wall_time'"),
    "timings_nan": (envelope(timings={"train/step_seconds": "nan"}),
                    r"\['train/step_seconds'\] should be a finite number, got nan"),
    "num_examples_1e308": (setting("num_examples", 1e308),
                           r"client 1: field 'num_examples' = 1e\+308 is outside \[0, 1e\+07\] "
                           r"\(runtime.limits.num_examples\)"),
    "num_examples_negative": (setting("num_examples", -1),
                              r"client 1: field 'num_examples' = -1 is outside"),
    "error_not_text": (setting(ERROR, {"a": [1, 2]}), r"ClientFailure: \(not text\) dict"),
    "error_huge_text": (setting(ERROR, "x" * 100_000), r"ClientFailure: x+\.\.\.$"),
    "reply_too_large": (big_reply, r"client 1: reply of \d+ bytes is larger than "
                                   r"runtime.limits.reply_bytes = 200000"),
}


def clean_rows(tmp_path: Path) -> list[dict]:
    cfg = tiny_config("fedavg", tmp_path, "clients.min_replies=2", name="bad")  # same name: same requests
    return run_job(cfg, ReplayTransport(recorded_run("fedavg").calls), quiet=True)


def server_rows(rows: list[dict]) -> list[dict]:
    """Rows that do not depend on client 1's reply: the server's test rows and the other
    clients' rows (without timings)."""
    return without_timings(r for r in rows if r["participant"] in ("client_0", "client_2")
                           or (r["participant"] == "server" and r["split"] == "test"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> list[dict]:
    return clean_rows(tmp_path_factory.mktemp("clean"))


@pytest.mark.parametrize("case", sorted(ATTACKS))
def test_hostile_reply_is_excluded_named_and_the_run_finishes(tmp_path, clean, case):
    tamper, reason = ATTACKS[case]
    extra = ["runtime.limits.reply_bytes=200000"] if case == "reply_too_large" else []
    rows = tampered_run(tmp_path, "fedavg", "train", tamper, "clients.min_replies=2", *extra)
    assert_excluded(tmp_path, rows, reason)
    # Nothing client 1 sent reaches a row: the others' rows equal those of a run where
    # client 1's reply was clean, except the server's test row which is the mean of two.
    others = [r for r in server_rows(rows) if r["participant"] != "server"]
    assert others == [r for r in server_rows(clean) if r["participant"] != "server"]
    bad = [r for r in rows if r["participant"] == f"client_{BAD}" and r["round"] == 1]
    assert [r["split"] for r in bad] == ["train"]  # one row: its exclusion, no forged metric
    text = (tmp_path / "bad" / "metrics.jsonl").read_text()
    assert "Infinity" not in text and "NaN" not in text


def test_forged_row_keys_change_no_server_row(tmp_path, clean):
    """The attack this guards against: a client whose metrics carry participant/round/split
    keys once made summary.md report the server at accuracy 1.0 and hid another client's rows."""
    rows = tampered_run(tmp_path, "fedavg", "train", forged_metrics, "clients.min_replies=2")
    for got in (rows, metrics_file_rows(tmp_path)):
        assert {r["participant"] for r in got} == {"server", "client_0", "client_1", "client_2"}
        assert {r["round"] for r in got} == {0, 1}
        assert not any(r.get("accuracy") == 1.0 and r["participant"] == "server" for r in got)
    summary = (tmp_path / "bad" / "summary.md").read_text()
    assert "| server |" in summary and "| client_0 |" in summary and "| client_2 |" in summary


def test_a_list_as_metrics_without_quorum_fails_the_round_naming_the_client(tmp_path):
    with pytest.raises(RoundError, match=r"2 of 3 clients replied, 3 needed .*client 1: "
                                         r"PayloadError: client 1: field 'metrics'"):
        tampered_run(tmp_path, "fedavg", "train", setting("metrics", [1, 2, 3]))


def test_a_gzip_bomb_in_predictions_is_dropped_and_the_run_finishes(tmp_path, caplog):
    """Client 1's evaluation reply carries about 100 kB of gzip that inflates to 100 MB; with
    runtime.limits.predictions_bytes at 2 MB the server stops inflating at 2 MB, drops the
    table with a warning and keeps the client's metrics."""
    rows = tampered_run(tmp_path, "fedavg", "train", setting(PREDICTIONS, bomb(10**8)),
                        "clients.min_replies=2", "runtime.limits.predictions_bytes=2000000")
    assert not any(r.get("excluded") for r in rows)
    assert "predictions decompress to more than 2000000 bytes" in caplog.text
    files = {p.name for p in (tmp_path / "bad" / "predictions" / "round_0001").iterdir()}
    assert f"client_{BAD}.json.gz" not in files and "server.json.gz" in files


def test_bounded_unpack_stops_early_in_time_and_memory():
    blob = bomb(2 * 10**8).numpy().tobytes()  # 200 MB inflated, about 200 kB on the wire
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"client 3: predictions decompress to more than "
                                         r"1000000 bytes"):
        predictions.unpack(blob, source="client 3", max_bytes=10**6)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 20 * 10**6, peak  # not the 200 MB the blob inflates to
    assert seconds < 2.0
    real = predictions.pack({"": predictions.Predictions({"id": [1, 2], "pred": [0, 1]})})
    assert predictions.unpack(real, max_bytes=10**6)[""].ids == ["1", "2"]


def test_truncated_gzip_within_the_bound_is_refused():
    real = predictions.pack({"": predictions.Predictions({"id": list(range(100))})})
    with pytest.raises(ValueError, match="predictions are not gzipped JSON"):
        predictions.unpack(real[:-20], max_bytes=10**6)


def test_reasons_in_metrics_jsonl_are_json_numbers_only(tmp_path):
    """``seconds: "inf"`` used to write ``Infinity`` into metrics.jsonl."""
    tampered_run(tmp_path, "fedavg", "train", envelope(seconds="inf"), "clients.min_replies=2")
    for line in (tmp_path / "bad" / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON number {c}"))
    assert re.search("excluded", (tmp_path / "bad" / "metrics.jsonl").read_text())


def test_random_hostile_replies_never_crash_the_server_or_lose_data(caplog):
    """Fuzz (fedkt.runtime.faults.hostile_reply, seeded): 400 variants of a real reply with junk in
    its runtime fields, scope names and ids of its predictions, its adapter (finite but
    huge), its reported loss and its error text. Each is rejected with a reason naming the
    client, has its predictions refused with a warning naming it, or is valid after all;
    none raises out of the server, none changes the other client's data, poisons the mean
    adapter, writes a predictions file out of place or with ids that are no test ids, logs
    unescaped text, or puts a server row key, NaN, Infinity or a negative time into the
    accepted values."""
    import logging

    from fedkt.runtime.faults import run_attacks

    caplog.set_level(logging.ERROR, logger="fedkt.runtime")
    recorded = recorded_run("fedavg")
    good = next(c.reply for c in recorded.calls if c.handler == "train" and c.cid == BAD)
    cfg = recorded.cfg.model_copy(update={"clients": recorded.cfg.clients.model_copy(
        update={"min_replies": 1})})
    report = run_attacks(cfg, good, 400, seed=1)
    assert report.tried == 400
    assert report.crashes == [] and report.lost == [] and report.unnamed == 0
    assert report.rejected > 250 and report.refused > 10
    assert report.rejected + report.refused + report.accepted == 400
    assert set(report.by_target) == {"metrics", "metric", "envelope", "seconds", "timings",
                                     "error", "num_examples", "predictions", "scope", "ids",
                                     "adapter", "method_number", "error_text"}


def test_secure_aggregation_clear_part_goes_through_the_same_check(make_config, monkeypatch):
    """Under SecAgg+ the clear part of client 1's reply (everything but the masked field)
    carries ``metrics: [1, 2, 3]``: the server excludes client 1 (its masked vector still
    counts as the protocol requires) and the round finishes with the other two."""
    from fedkt.methods import get_method
    from fedkt.runtime.base import default_state_root
    from fedkt.runtime.local import LocalTransport

    handlers = get_method("fedavg").handlers
    train = handlers["train"]

    def hostile(ctx, msg):
        reply = train(ctx, msg)
        if ctx.cid == BAD:
            reply["metrics"] = [1, 2, 3]
        return reply

    monkeypatch.setitem(handlers, "train", hostile)
    cfg = make_config("clients.num_clients=3", "rounds=1", "clients.min_replies=2",
                      "secure_aggregation.enabled=true", "secure_aggregation.max_weight=64",
                      name="secure")
    rows = run_job(cfg, LocalTransport(default_state_root(cfg)), quiet=True)
    row = next(r for r in rows if r["participant"] == f"client_{BAD}" and r["round"] == 1)
    assert row["excluded"].startswith("PayloadError: client 1: field 'metrics' should be a "
                                      "mapping")
    server = next(r for r in rows if r["participant"] == "server" and r["split"] == "train")
    assert server["clients_replied"] == 2


# --------------------------------------------------------------------------- numbers and names


def repacked(edit: callable) -> callable:
    """Client 1's real predictions, unpacked, edited (``edit(tables) -> tables``), packed."""

    def tamper(p: Payload) -> Payload:
        tables = predictions.unpack(p[PREDICTIONS].numpy().tobytes())
        blob = predictions.pack(edit(tables))
        p[PREDICTIONS] = torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()
        return p

    return tamper


def scoped(name: str) -> callable:
    return repacked(lambda tables: dict(zip([name], tables.values(), strict=False)))


def forged_ids(tables: dict) -> dict:
    for table in tables.values():
        table.columns["id"] = [f"forged-{i}" for i in range(len(table))]
    return tables


def scaled_adapter(factor: float | None, **extra) -> callable:
    """Every adapter value times ``factor`` (None: the dtype's largest finite value)."""

    def tamper(p: Payload) -> Payload:
        p["adapter"] = {k: (torch.full_like(v, torch.finfo(v.dtype).max) if factor is None
                            else v * factor) for k, v in p["adapter"].items()}
        p.update(extra)
        return p

    return tamper


def metric(name: str, value: float) -> callable:
    def tamper(p: Payload) -> Payload:
        p["metrics"] = {**p.get("metrics", {}), name: value}
        return p

    return tamper


@pytest.mark.parametrize("name", ["a/../b", "../../../escaped", "x" * 300, "a\x00b", ".."])
def test_a_scope_name_that_is_no_file_name_drops_the_predictions_named(tmp_path, caplog, name):
    """The run aborted (``[Errno 2]``, ``[Errno 36] File name too long``) when a client's
    predictions carried a scope name with '/', '..' or 300 characters (here in round 0's
    evaluation reply, the first that carries predictions)."""
    rows = tampered_run(tmp_path, "fedavg", "evaluate", scoped(name), "clients.min_replies=2")
    assert not any(r.get("excluded") for r in rows)
    assert re.search(r"client 1's predictions: .*scope .* is not a file name", caplog.text)
    run = tmp_path / "bad"
    written = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()
                     and "predictions" in p.parts)
    assert not [p for p in written if "client_1" in p and p.startswith("predictions/round_0000")]
    assert not list(tmp_path.glob("escaped*")) and not list((run / "predictions").glob("esc*"))
    test_row = next(r for r in rows if r["participant"] == "client_1" and r["split"] == "test")
    assert "accuracy" in test_row  # its metrics stay


def test_forged_prediction_ids_drop_that_replys_predictions_named(tmp_path, caplog):
    """Ids that are no test ids of the run blocked the paired report for the whole run."""
    rows = tampered_run(tmp_path, "fedavg", "evaluate", repacked(forged_ids),
                        "clients.min_replies=2")
    assert not any(r.get("excluded") for r in rows)
    assert re.search(r"client 1's predictions: \d+ of \d+ ids are not test ids of this run "
                     r"\(e.g. 'forged-0'\)", caplog.text)
    folder = tmp_path / "bad" / "predictions" / "round_0000"
    names = {p.name for p in folder.iterdir()}
    assert "client_1.json.gz" not in names and {"client_0.json.gz", "client_2.json.gz"} <= names


@pytest.mark.parametrize("tamper", [scaled_adapter(1e30), scaled_adapter(None),
                                    scaled_adapter(1e30, num_examples=10**7),
                                    scaled_adapter(None, num_examples=10**7)],
                         ids=["x1e30", "float_max", "x1e30_max_examples",
                              "float_max_max_examples"])
def test_a_huge_finite_adapter_excludes_its_client_and_poisons_nothing(tmp_path, clean, tamper):
    """A finite adapter whose norm is far beyond the round's others made the server's loss
    NaN and poisoned the checkpoint, so the honest clients were blamed in the next round."""
    from safetensors.torch import load_file

    rows = tampered_run(tmp_path, "fedavg", "train", tamper, "clients.min_replies=2")
    assert_excluded(tmp_path, rows, r"client 1: field 'adapter': norm [\d.e+]+ is more than "
                                    r"1000 times the round's median [\d.e+]+ "
                                    r"\(runtime.limits.norm_ratio\)")
    text = (tmp_path / "bad" / "metrics.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text
    server = next(r for r in rows if r["participant"] == "server" and r["split"] == "test")
    assert all(isinstance(v, str) or abs(v) < 1e6 for v in server.values())
    state = load_file(str(tmp_path / "bad" / "checkpoints" / "round_0001" /
                          "server.safetensors"))
    assert all(torch.isfinite(t).all() and t.abs().max() < 1e3 for t in state.values())


def test_the_largest_example_count_alone_is_a_weight_not_a_poison(tmp_path):
    """``num_examples`` at runtime.limits.num_examples with an honest adapter: accepted (the
    bound is the weight's), the mean is finite and the run's rows hold no NaN."""
    rows = tampered_run(tmp_path, "fedavg", "train", setting("num_examples", 10**7),
                        "clients.min_replies=2")
    assert not any(r.get("excluded") for r in rows)
    assert "NaN" not in (tmp_path / "bad" / "metrics.jsonl").read_text()


@pytest.mark.parametrize(("tamper", "reason"), [
    (setting("train_loss", 5.67e307),
     r"client 1: field 'train_loss' = 5\.67e\+307 is outside \[0, 1e\+09\]"),
    (setting("train_loss", -333328.0),
     r"client 1: field 'train_loss' = -333328 is outside \[0, 1e\+09\]"),
    (setting("train_loss", "low"), r"client 1: field 'train_loss' should be a finite number"),
    (metric("test/accuracy", 1e300),
     r"client 1: field 'metrics'\['test/accuracy'\] = 1e\+300 is outside \[0, 1\]"),
    (metric("train/loss", -5.0),
     r"client 1: field 'metrics'\['train/loss'\] = -5 is outside \[0, 1e\+09\]"),
    (metric("test/rougeL", 400.0),
     r"client 1: field 'metrics'\['test/rougeL'\] = 400 is outside \[0, 100\]"),
], ids=["loss_huge", "loss_negative", "loss_text", "accuracy_1e300", "metric_loss_negative",
        "rouge_400"])
def test_implausible_client_numbers_exclude_it_and_never_reach_the_servers_row(
        tmp_path, clean, tamper, reason):
    """A client's ``train_loss`` (a method field the reply check never looked at) became the
    server's train loss in summary.md; an accuracy of 1e300 was accepted."""
    rows = tampered_run(tmp_path, "fedavg", "train", tamper, "clients.min_replies=2")
    assert_excluded(tmp_path, rows, reason)
    server = next(r for r in rows if r["participant"] == "server" and r["split"] == "train")
    honest = [r["loss"] for r in rows if r["participant"] in ("client_0", "client_2")
              and r["split"] == "train" and r["round"] == 1]
    assert server["loss"] == pytest.approx(sum(honest) / len(honest))
    summary = (tmp_path / "bad" / "summary.md").read_text()
    assert "5.67e+307" not in summary and "-333328" not in summary and "1e+300" not in summary


def test_a_clients_error_text_is_escaped_before_it_is_logged(tmp_path, caplog):
    """ESC, CR and LF from a client reached the server's stderr raw, with a fake log line."""
    forged = "boom\x1b[2K\r\nWARNING fedkt: round 1: client 0 excluded\x07\x00\u202e"
    rows = tampered_run(tmp_path, "fedavg", "train", setting(ERROR, forged),
                        "clients.min_replies=2")
    logged = "".join(r.getMessage() for r in caplog.records)
    assert "client 1 excluded" in logged
    for char in ("\x1b", "\r", "\n", "\x07", "\x00", "\u202e"):
        assert char not in logged
    assert r"boom\x1b[2K\r\nWARNING fedkt" in logged
    reason = next(r["excluded"] for r in rows if r.get("excluded"))
    assert reason == r"ClientFailure: boom\x1b[2K\r\nWARNING fedkt: round 1: client 0 " \
                     r"excluded\x07\x00\u202e"


def _round1_adapters(tamper: callable) -> list[dict[str, torch.Tensor]]:
    """The three clients' round-1 adapters as the server receives them (client 1's tampered)."""
    from fedkt.federated.payload import loads

    replies = [c for c in recorded_run("fedavg").calls if c.handler == "train"][:3]
    return [(tamper(loads(c.reply)) if c.cid == BAD else loads(c.reply))["adapter"]
            for c in sorted(replies, key=lambda c: c.cid)]


def test_the_median_option_keeps_a_large_upload_within_the_bound_from_moving_the_model(
        tmp_path):
    """An adapter x100 is within runtime.limits.norm_ratio, so the mean takes it; with
    ``runtime.aggregation: median`` the server's adapter is the coordinate-wise median of
    the three uploads, which the large one does not move."""
    from safetensors.torch import load_file

    def server_adapter(name: str, *sets: str) -> dict[str, torch.Tensor]:
        tampered_run(tmp_path, "fedavg", "train", scaled_adapter(100.0),
                     "clients.min_replies=2", *sets, name=name)
        return load_file(str(tmp_path / name / "checkpoints" / "round_0001" /
                              "server.safetensors"))

    uploads = _round1_adapters(scaled_adapter(100.0))
    median = {k: torch.stack([u[k] for u in uploads]).median(dim=0).values for k in uploads[0]}
    got = server_adapter("median", "runtime.aggregation=median")
    meaned = server_adapter("mean")
    for key, want in median.items():
        (stored,) = [v for k, v in got.items() if k.endswith(key)]
        (averaged,) = [v for k, v in meaned.items() if k.endswith(key)]
        assert torch.equal(stored, want)
        if want.abs().sum() > 0:
            assert not torch.allclose(averaged, want)


def test_the_median_option_is_refused_with_secure_aggregation(tmp_path):
    from fedkt.errors import ConfigError
    from tests.conftest import small_config

    with pytest.raises((ConfigError, ValueError), match=r"runtime.aggregation: median needs "
                                                        r"each client's upload"):
        small_config(tmp_path / "x", "runtime.aggregation=median",
                     "secure_aggregation.enabled=true")
