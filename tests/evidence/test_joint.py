"""Joint claims (``CLAIM and CLAIM``): parsing, the intersection-union verdict for each
combination of parts, the suite's row and ``suite across`` reading it, known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedkt.config import ConfigError
from fedkt.evidence import suite_report as suite_mod
from fedkt.evidence.across import across_report, read_suite_result
from fedkt.evidence.claims import (
    CONTRADICTED,
    FRAGILE,
    NOT_RESOLVED,
    REPRODUCED,
    ClaimError,
    Decision,
    Joint,
    decide_joint,
    parse_claim,
)
from fedkt.evidence.suite import load_suite

ROOT = Path(__file__).resolve().parents[2]
KEEP = ("rehearse_t2.server.accuracy_cli > max(rehearse_t2_shuffled, rehearse_t2_marginal)"
        ".server.accuracy_cli and rehearse_t2.server.accuracy_srv >= "
        "fedmkt_none.server.accuracy_srv - 0.03")


def test_a_joint_claim_parses_into_its_parts():
    claim = parse_claim(KEEP)
    assert isinstance(claim, Joint) and len(claim.parts) == 2
    first, second = claim.parts
    assert first.rhs.arms == ("rehearse_t2_shuffled", "rehearse_t2_marginal")
    assert (second.op, second.offset, second.lhs.metric) == (">=", -0.03, "accuracy_srv")
    assert claim.arms() == {"rehearse_t2", "rehearse_t2_shuffled", "rehearse_t2_marginal",
                            "fedmkt_none"}
    with pytest.raises(ClaimError, match="unknown arm"):
        parse_claim(KEEP, {"rehearse_t2", "fedmkt_none"})
    with pytest.raises(ClaimError, match="does not parse"):
        parse_claim("a.server.accuracy > b.server.accuracy and nonsense")
    assert not isinstance(parse_claim("a.server.accuracy > band.server.accuracy"), Joint)


def test_the_keep_suite_takes_a_joint_primary(tmp_path):
    data = yaml.safe_load((ROOT / "fedkt" / "configs" / "suites" / "fedmkt_keep.yaml")
                          .read_text())
    data["primary"] = KEEP
    data["base"]["name"] = "keep"
    path = tmp_path / "keep.yaml"
    path.write_text(yaml.safe_dump(data))
    suite = load_suite(path, tmp_path / "out")
    assert isinstance(suite.primary, Joint) and suite.claims[0] is suite.primary
    data["primary"] = KEEP.replace("fedmkt_none", "fedmkt_nothing")
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="unknown arm"):
        load_suite(path, tmp_path / "out")


R, C, N, F = (Decision(REPRODUCED), Decision(CONTRADICTED),
              Decision(NOT_RESOLVED, "the interval contains the boundary"),
              Decision(FRAGILE, "reproduced by the interval, but 2 seeds (4 needed)"))


@pytest.mark.parametrize(("parts", "word"), [
    ((R, R), REPRODUCED), ((R, R, R), REPRODUCED),
    ((R, C), CONTRADICTED), ((C, R), CONTRADICTED), ((C, C), CONTRADICTED),
    ((N, C), CONTRADICTED), ((F, C), CONTRADICTED),
    ((R, N), NOT_RESOLVED), ((N, N), NOT_RESOLVED), ((R, F), NOT_RESOLVED),
    ((F, F), NOT_RESOLVED),
])
def test_joint_verdict_for_each_combination(parts, word):
    assert decide_joint(parts).verdict == word


def test_joint_reasons_name_the_parts():
    assert decide_joint((R, C, C)).reason == "parts 2, 3 contradicted"
    got = decide_joint((R, F, N))
    assert got.reason == ("part 2 fragile: reproduced by the interval, but 2 seeds (4 needed); "
                          "part 3 not resolved: the interval contains the boundary")
    assert decide_joint((R, Decision("not run"))).verdict == "not run"


def _part(estimate: float, low: float, high: float, per_seed: list[float], verdict: str,
          reason: str = "") -> dict:
    return {"estimate": f"{estimate:+.4f}", "ci": f"[{low:+.4f}, {high:+.4f}]",
            "verdict": verdict, "reason": reason, "seed_ci": "-", "floor_text": "0.100",
            "per_seed": {str(k): v for k, v in enumerate(per_seed)},
            "per_seed_text": ", ".join(f"{v:+.3f}" for v in per_seed)}


def test_a_suite_row_holds_each_part(monkeypatch):
    claim = parse_claim("a.server.accuracy_cli > b.server.accuracy_cli and "
                        "a.server.accuracy_srv >= c.server.accuracy_srv - 0.03")
    rows = {claim.parts[0].text: _part(0.2, 0.1, 0.3, [0.2, 0.1, 0.3, 0.2], REPRODUCED),
            claim.parts[1].text: _part(0.01, -0.02, 0.04, [0.0, 0.01, 0.02, 0.01],
                                       NOT_RESOLVED, "the interval contains the boundary")}
    monkeypatch.setattr(suite_mod, "_decide_interval",
                        lambda suite, part: {"claim": part.text, **rows[part.text]})
    fake = type("S", (), {"primary": claim, "claims": [claim]})()
    row = suite_mod._decide(fake, claim)
    assert row["verdict"] == NOT_RESOLVED and row["role"] == "primary"
    assert row["reason"] == "part 2 not resolved: the interval contains the boundary"
    assert row["estimate"] == "+0.2000; +0.0100"
    assert row["ci"] == "[+0.1000, +0.3000]; [-0.0200, +0.0400]"
    assert row["per_seed_text"] == "+0.200, +0.100, +0.300, +0.200; +0.000, +0.010, +0.020, +0.010"
    assert [p["claim"] for p in row["parts"]] == [p.text for p in claim.parts]


def test_across_reads_a_joint_row_and_pools_each_part(tmp_path):
    text = ("a.server.accuracy_cli > b.server.accuracy_cli and "
            "a.server.accuracy_srv >= c.server.accuracy_srv - 0.03")
    folders = []
    for name, second in (("fp32", [0.0, 0.01, 0.02, 0.01]), ("bf16", [0.02, 0.03, 0.02, 0.05])):
        parts = [_part(0.2, 0.1, 0.3, [0.2, 0.1, 0.3, 0.2], REPRODUCED),
                 _part(0.01, -0.02, 0.04, second, NOT_RESOLVED, "boundary")]
        for part, part_text in zip(parts, text.split(" and "), strict=True):
            part["claim"] = part_text
        row = {"claim": text, "role": "primary", "verdict": NOT_RESOLVED, "reason": "part 2",
               **{k: "; ".join(p[k] for p in parts) for k in ("estimate", "ci", "per_seed_text")},
               "parts": parts}
        folder = tmp_path / name
        folder.mkdir()
        (folder / "suite.json").write_text(json.dumps({"name": "s", "claims": [row]}))
        folders.append(folder)
    assert read_suite_result(folders[0]).claims[text]["parts"][1]["verdict"] == NOT_RESOLVED
    out = across_report(folders)
    cell = next(x for x in out.splitlines() if x.startswith("| primary")).split("|")[-2].strip()
    # part 1: fold means 0.2, 0.1, 0.3, 0.2 -> reproduced; part 2: 0.01, 0.02, 0.02, 0.03
    # (mean 0.02, t-interval clear of 0) -> reproduced: the joint pooled verdict too
    assert cell.startswith("part 1: +0.2000 [")
    assert "part 2: +0.0200 [" in cell and cell.endswith("; reproduced")
