"""The shipped KOALA suite (fedkt/configs/suites/koala.yaml), two arms at tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedkt.eval.predictions import prediction_files, read_predictions
from fedkt.evidence.claims import FRAGILE, NOT_RESOLVED
from fedkt.evidence.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
KOALA = ROOT / "configs" / "suites" / "koala.yaml"


def test_shipped_koala_suite_validates_every_run_and_claim():
    suite = load_suite(KOALA)
    assert set(suite.cfg.arms) == {"baseline", "homo", "hete", "homo_no_fd", "random_homo",
                                   "random_hete", "untrained_homo", "marginal_homo"}
    assert suite.cfg.seeds == [0, 1, 2, 7] and len(suite.runs) == 32
    assert suite.runs[("random_hete", 0)].method.teacher == "shuffled"
    # the shuffled controls redraw the permutation every reverse pass
    assert {suite.runs[(a, 7)].method.shuffle_every for a in ("random_homo", "random_hete")} \
        == {"epoch"}
    assert suite.runs[("untrained_homo", 1)].method.teacher == "untrained"
    assert suite.runs[("marginal_homo", 2)].method.teacher == "marginal"
    # each control has an equivalence claim: at chance and at its own round 0
    equiv = {str(c.lhs): c for c in suite.claims if c.op == "~="}
    assert set(equiv) == {"random_homo.server.accuracy", "random_hete.server.accuracy",
                          "untrained_homo.server.accuracy", "marginal_homo.server.accuracy"}
    assert all(c.tolerance == 0.1 for c in equiv.values())
    assert suite.runs[("random_hete", 0)].method.mode == "hete"
    assert not suite.runs[("homo_no_fd", 1)].method.forward_distillation
    assert suite.runs[("baseline", 2)].method.name == "fedavg_vision"
    # Every arm's server pretrains on the same class-disjoint data.
    pre = {r.method.pretrain.model_dump_json() for r in suite.runs.values()}
    assert len(pre) == 1
    assert {str(c.lhs) for c in suite.claims} >= {"homo.server.accuracy",
                                                  "hete.server.accuracy"}


def _tiny_suite(folder: Path) -> Path:
    raw = yaml.safe_load(KOALA.read_text())
    base = raw["base"]
    base["rounds"] = 2
    base["server"]["tiny"] = {"width": 4, "depth": 11}
    base["clients"]["models"] = [{"name": "mobilenet_v2_small", "tiny": {"width_mult": 0.25}}]
    base["data"]["dataset"]["max_records"] = 300
    base["method"]["pretrain"].update(epochs=3)
    base["method"]["pretrain"]["dataset"]["max_records"] = 200
    raw.update(name="koala_smoke", seeds=[0], baseline="random_homo",
               arms={a: raw["arms"][a] for a in ("homo", "random_homo")},
               claims=["homo.server.accuracy > random_homo.server.accuracy",
                       "homo.server.client_storage_reduction >= 0.976"])
    path = folder / "koala_smoke.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_koala_suite_smoke_two_arms(tmp_path):
    from fedkt.data.images import data_spec
    from fedkt.methods.koala.reductions import client_reductions

    path = _tiny_suite(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "FEDKT_CACHE": str(tmp_path / "c")}
    proc = subprocess.run([sys.executable, "-m", "fedkt.cli", "suite", "run", str(path),
                           "--output-dir", str(out), "--jobs", "2"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "suite.json").read_text())
    verdicts = {c["claim"]: c for c in result["claims"]}
    # one seed: a decided interval is fragile (4 needed), its side in the reason
    assert all(c["verdict"] in (NOT_RESOLVED, FRAGILE) for c in verdicts.values())
    # Table 2's claim is exact arithmetic on the counted models of the run.
    suite = load_suite(path, out)
    cfg = suite.runs[("homo", 0)]
    from fedkt.data.splits import run_data

    sizes = client_reductions(cfg, data_spec(run_data(cfg.data, 5, 0)))
    table2 = verdicts["homo.server.client_storage_reduction >= 0.976"]
    assert table2["value"] == pytest.approx(sizes["client_storage_reduction"] - 0.976, abs=1e-9)
    # a 0.25-wide MobileNetV2 beside a 4-wide VGG
    assert (table2["verdict"], table2["reason"]) == (
        FRAGILE, "contradicted by the interval, but 1 seed (4 needed)")
    # Both arms start from the same pretrained backbone and adapter (round 0 identical);
    # the same clients' soft labels, shuffled across proxy images, give another KL.
    first = {}
    for arm in ("homo", "random_homo"):
        files = prediction_files(out / arm / "seed_0")
        first[arm] = read_predictions(files[(0, "server", "")]).columns["pred"]
    assert first["homo"] == first["random_homo"]
    kl = {}
    for arm in ("homo", "random_homo"):
        rows = [json.loads(x) for x in (out / arm / "seed_0" / "metrics.jsonl").read_text()
                .splitlines() if x.strip()]
        kl[arm] = [r["reverse_kl"] for r in rows if r["participant"] == "server"
                   and r["split"] == "train"]
    assert len(kl["homo"]) == 2 and kl["homo"][0] != pytest.approx(kl["random_homo"][0])
    text = (out / "suite.md").read_text()
    assert "round 0" in text and "server accuracy" in text
