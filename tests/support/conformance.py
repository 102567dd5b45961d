"""Conformance checks of a registered method (``tests/methods/test_conformance.py`` runs them
for every method; ``tests/methods/test_new_method.py`` for a copied one).

:func:`check_method` runs the method's tiny config (``Method.conformance.tiny_config``, with
``method.name`` set to the method's) for two rounds on the local runtime through a
transport that records the exact bytes every client sends back, and asserts:

1. every client handler has a shared name (``train``, ``evaluate``, ``adopt``:
   :data:`fedkt.methods.base.SHARED_HANDLERS`) or is listed with what it does in
   ``Method.conformance.own_handlers`` (:func:`handler_name_problems`), every handler is
   declared (``Method.conformance.uploads``) and every reply stays within its declaration
   (:func:`fedkt.methods.uploads.undeclared`);
2. payload inspection is clean: no private text or image in any reply's bytes, no
   base-model weight by name or value (:mod:`tests.support.inspection`);
3. resume is exact: a copy of the run folder as a crash in round 2 leaves it (round 2's
   metrics and client state written, no checkpoint) resumes to the same metrics rows and
   the same final server state and holdings as the run that was not interrupted;
4. one meaning of ``loss`` on the server's train row (:func:`check_train_loss`): the mean
   of the clients' training losses of that round.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fedkt.config import RunConfig
from fedkt.methods import get_method
from fedkt.methods.base import SHARED_HANDLERS, Method
from fedkt.runtime.base import default_state_root
from fedkt.runtime.job import run_job
from fedkt.runtime.local import LocalTransport
from fedkt.tracking import HOLDINGS, SERVER_STATE, RunRecorder, without_timings
from tests.support.inspection import check_reply, private_needles
from tests.support.trust_helpers import RecordedRun, RecordingTransport, scratch, tiny_config


@dataclass
class ConformanceRun:
    """What :func:`check_method` found (for tests that look further)."""

    run: RecordedRun
    resumed_rows: list[dict]


_DONE: dict[str, ConformanceRun] = {}


def conformance(name: str) -> ConformanceRun:
    """:func:`check_method` of ``name``, once per test session (its runs are kept)."""
    if name not in _DONE:
        _DONE[name] = check_method(name, scratch() / "conformance" / name)
    return _DONE[name]


def check_method(name: str, root: Path) -> ConformanceRun:
    """Run ``name`` on its tiny config and assert the three properties above."""
    torch.set_num_threads(1)
    method = get_method(name)
    problems = handler_name_problems(method)
    assert not problems, "; ".join(problems)
    uploads = method.conformance.uploads
    assert set(uploads) == set(method.handlers), \
        f"{name}: uploads declared for {sorted(uploads)}, handlers {sorted(method.handlers)}"
    # Two rounds, evaluated before training and after the last (round 0 and 2).
    cfg = tiny_config(name, root, "rounds=2", "eval.every=2", name="straight")
    transport = RecordingTransport(LocalTransport(default_state_root(cfg)))
    rows = run_job(cfg, transport, quiet=True)
    run = RecordedRun(cfg, rows, transport.calls)
    check_train_loss(name, rows, trains_clients=bool(method.handlers))

    # 1-2. every reply within its declaration; nothing private or base leaves a client
    replies = run.replies()
    if not method.handlers:
        assert run.calls == [], f"{name}: clients must never be called"
    else:
        assert replies, f"{name}: no client replied"
        assert {c.cid for c in replies} == set(cfg.client_ids())
        needles = private_needles(run)
        assert needles, "the run's private data has records to look for"
        bases: dict = {}
        for call in replies:
            check_reply(run, call.cid, call.handler, call.reply, needles, bases)

    # 3. crash in round 2 after its rows and the clients' state were written: resume
    crashed = resumed_copy(cfg, root / "crashed")
    resumed = run_job(crashed, LocalTransport(default_state_root(crashed)), resume=True,
                      quiet=True)
    assert without_timings(resumed) == without_timings(rows), \
        f"{name}: the resumed run's metrics differ"
    straight, again = (c.run_dir / "checkpoints" / "round_0002" for c in (cfg, crashed))
    sa, sb = (load_file(str(folder / SERVER_STATE)) for folder in (straight, again))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa), \
        f"{name}: the resumed run's server state differs"
    ha, hb = (json.loads((folder / HOLDINGS).read_text()) for folder in (straight, again))
    assert ha == hb, f"{name}: the resumed run's holdings differ"
    return ConformanceRun(run, resumed)


def handler_name_problems(method: Method) -> list[str]:
    """What is wrong with a method's handler names: one outside the shared vocabulary
    (:data:`~fedkt.methods.base.SHARED_HANDLERS`) that ``conformance.own_handlers`` does not
    list with what it does, an own handler that takes a shared name, or one listed that the
    method does not have."""
    own = method.conformance.own_handlers
    problems = [f"{method.name}: handler {h!r} is not one of the shared names "
                f"({', '.join(SHARED_HANDLERS)}) nor listed in conformance.own_handlers"
                for h in method.handlers if h not in SHARED_HANDLERS and h not in own]
    problems += [f"{method.name}: own handler {h!r} takes a shared name; its role is "
                 f"{SHARED_HANDLERS[h]!r}" for h in own if h in SHARED_HANDLERS]
    problems += [f"{method.name}: conformance.own_handlers lists {h!r}, which it has no "
                 "handler for" for h in own if h not in method.handlers]
    problems += [f"{method.name}: own handler {h!r} does not say what it does"
                 for h, what in own.items() if not (isinstance(what, str) and what.strip())]
    return problems


def check_train_loss(name: str, rows: list[dict], *, trains_clients: bool = True) -> None:
    """The server row's ``loss`` on the train split is the mean of the training losses the
    clients' rows of that round report (excluded clients aside), in every round after 0
    where it has one; the server's own objective goes under a key of its own
    (``server_loss``, ``reverse_kl``, ...).  A method without client handlers
    (``trains_clients=False``: centralized) trains only the server's model, and its
    ``loss`` is that model's."""
    for rnd in sorted({r["round"] for r in rows if r["round"] > 0}):
        mine = [r for r in rows if r["round"] == rnd and r["split"] == "train"]
        server = [r for r in mine if r["participant"] == "server"]
        assert len(server) == 1, f"{name}: round {rnd} has {len(server)} server train rows"
        losses = [r["loss"] for r in mine if r["participant"].startswith("client_")
                  and "loss" in r and "excluded" not in r]
        if not trains_clients:
            assert not losses, f"{name}: clients without handlers report a training loss"
            continue
        if "loss" not in server[0]:
            continue
        assert losses, (f"{name}: round {rnd}: the server row has a train loss "
                        f"({server[0]['loss']}) but no client row has one")
        assert server[0]["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-6), (
            f"{name}: round {rnd}: the server row's train loss {server[0]['loss']} is not "
            f"the clients' mean {sum(losses) / len(losses)} (their losses: {losses}); "
            "the server's own objective goes under a key of its own")


def resumed_copy(cfg: RunConfig, where: Path) -> RunConfig:
    """A copy of ``cfg``'s finished run folder as a crash in its last round leaves it: the
    round's rows, predictions and client state written, its checkpoint not."""
    shutil.copytree(cfg.run_dir, where)
    last = cfg.rounds
    shutil.rmtree(where / "checkpoints" / f"round_{last:04d}")
    RunRecorder(where, resume=True).mark_complete(last - 1, {"state": SERVER_STATE})
    return cfg.model_copy(update={"output_dir": str(where)})
