"""``fedkt suite across``: one suite's verdicts under several environments, on result
files with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.cli import main
from fedkt.evidence.across import across_report, joint_verdict, read_suite_result

ROOT = Path(__file__).resolve().parents[2]

PRIMARY = "a.server.accuracy > b.server.accuracy"
OTHER = "a.clients.accuracy > b.clients.accuracy"


def _claim(text: str, verdict: str, role: str = "secondary", reason: str = "") -> dict:
    return {"claim": text, "estimate": "+0.1000", "ci": "[+0.0100, +0.2000]",
            "verdict": verdict, "reason": reason, "per_seed_text": "+0.1, +0.1, +0.1, +0.1",
            "role": role}


def _folder(root: Path, name: str, claims: list[dict], env: list[str] | None,
            suite: str = "demo") -> Path:
    folder = root / name
    folder.mkdir()
    data = {"name": suite, "seeds": [0, 1, 2, 3], "claims": claims}
    if env is not None:
        data["environment"] = env
    (folder / "suite.json").write_text(json.dumps(data))
    return folder


def test_joint_verdict_agrees_only_when_every_environment_does():
    assert joint_verdict(["reproduced", "reproduced"]) == "reproduced under both"
    assert joint_verdict(["not resolved"] * 3) == "not resolved under all 3"
    # one setting decided, another could not: that is not the machine moving the answer
    assert joint_verdict(["reproduced", "not resolved"]) == (
        "differs: reproduced / not resolved")
    assert joint_verdict(["fragile", "contradicted"]) == "differs: fragile / contradicted"
    # machine-dependent: two settings decided opposite sides
    assert joint_verdict(["reproduced", "contradicted"]) == (
        "machine-dependent: reproduced / contradicted")
    assert joint_verdict(["contradicted", "not resolved", "reproduced"]).startswith(
        "machine-dependent")
    assert joint_verdict(["reproduced", None], ["bf16", "fp32"]) == (
        "not compared: absent in fp32")


def test_report_pairs_claims_by_text_and_names_each_environment(tmp_path):
    amx = _folder(tmp_path, "amx", [_claim(PRIMARY, "reproduced", "primary"),
                                    _claim(OTHER, "reproduced")],
                  ["- environment: torch 2.13.0; CPU AVX512 (amx_bf16)"])
    fp32 = _folder(tmp_path, "fp32", [_claim(OTHER, "fragile", reason="2 seeds (4 needed)"),
                                      _claim(PRIMARY, "reproduced", "primary")],
                   ["- environment: torch 2.13.0; CPU AVX2"])
    text = across_report([f"bf16={amx}", str(fp32)])
    rows = {line.split("|")[2].strip(): line for line in text.splitlines()
            if line.startswith("| ") and "accuracy" in line}
    assert rows[PRIMARY].split("|")[-3].strip() == "reproduced under both"
    assert rows[PRIMARY].split("|")[1].strip() == "primary"
    assert rows[OTHER].split("|")[-3].strip() == "differs: reproduced / fragile"
    assert "| bf16 | fp32 |" in text.replace("|  | claim ", "")
    assert "CPU AVX512 (amx_bf16)" in text and "CPU AVX2" in text
    assert "fp32, `a.clients.accuracy > b.clients.accuracy`: 2 seeds (4 needed)" in text
    # the primary row comes first, in the first folder's order
    order = [line.split("|")[2].strip() for line in text.splitlines()
             if line.startswith("| ") and "accuracy" in line]
    assert order == [PRIMARY, OTHER]
    assert "not a second kernel setting" not in text


def test_same_environment_twice_is_named(tmp_path):
    env = ["- environment: torch 2.13.0; CPU AVX2"]
    a = _folder(tmp_path, "a", [_claim(PRIMARY, "reproduced", "primary")], env)
    b = _folder(tmp_path, "b", [_claim(PRIMARY, "reproduced", "primary")], env)
    assert "b reports the same environment as a; this is not a second kernel setting" in (
        across_report([a, b]))
    # another commit's code under the same kernels is not a second kernel setting either
    c = _folder(tmp_path, "c", [_claim(PRIMARY, "reproduced", "primary")],
                ["- environment: fedkt code 0123456789ab (commit 339dd2470); torch 2.13.0; "
                 "CPU AVX2"])
    d = _folder(tmp_path, "d", [_claim(PRIMARY, "reproduced", "primary")],
                ["- environment: torch 2.13.0; CPU AVX512 (amx_bf16)"])
    text = across_report([a, c, d])
    assert "c reports the same environment as a; this is not a second kernel setting" in text
    assert "d reports the same environment" not in text


def test_environments_of_a_mixed_suite_md_end_with_their_list(tmp_path):
    old = _folder(tmp_path, "old", [_claim(PRIMARY, "reproduced", "primary")], None)
    (old / "suite.md").write_text("# Suite demo\n\n- **runs from 2 environments**; care:\n"
                                  "  - 3 run(s): CPU AVX2\n  - 1 run(s): CPU AVX512\n\n"
                                  "## Notes\n\n- a list\n  - not an environment\n")
    assert read_suite_result(old).environment == [
        "- **runs from 2 environments**; care:", "  - 3 run(s): CPU AVX2",
        "  - 1 run(s): CPU AVX512"]


def test_environment_read_from_an_older_suite_md(tmp_path):
    old = _folder(tmp_path, "old", [_claim(PRIMARY, "reproduced", "primary")], None)
    (old / "suite.md").write_text("# Suite demo\n\n- seeds: [0]\n- environment: torch 2.4; "
                                  "CPU AVX2\n\n| arm |\n")
    assert read_suite_result(old).environment == ["- environment: torch 2.4; CPU AVX2"]


def test_bad_inputs_name_the_folder(tmp_path, capsys):
    a = _folder(tmp_path, "a", [_claim(PRIMARY, "reproduced", "primary")], [])
    other = _folder(tmp_path, "other", [_claim(PRIMARY, "reproduced", "primary")], [],
                    suite="another")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"{empty}: no suite.json or suite.md"):
        across_report([a, empty])
    with pytest.raises(ValueError, match="different suites: .*other \\(another\\)"):
        across_report([a, other])
    with pytest.raises(ValueError, match="two or more"):
        across_report([a])
    with pytest.raises(ValueError, match="share a label"):
        across_report([f"x={a}", f"x={a}"])
    (empty / "suite.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a suite's result"):
        across_report([a, empty])
    assert main(["suite", "across", str(a), str(other)]) == 2
    assert "different suites" in capsys.readouterr().err


def test_cli_writes_the_table(tmp_path, capsys):
    a = _folder(tmp_path, "a", [_claim(PRIMARY, "reproduced", "primary")], ["- environment: x"])
    b = _folder(tmp_path, "b", [_claim(PRIMARY, "not resolved", "primary")], ["- environment: y"])
    out = tmp_path / "across.md"
    assert main(["suite", "across", str(a), str(b), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed == out.read_text()
    assert "differs: reproduced / not resolved" in printed


@pytest.mark.parametrize("name", ["fedmkt_transfer", "fedcollm_transfer"])
def test_a_table_alone_gives_what_its_json_gives(tmp_path, name):
    """A published folder may keep only suite.md: its Claims table is read to the same
    verdicts, reasons and texts as the suite.json written beside it (a reason with '|')."""
    published = ROOT / "docs" / "suites" / name
    table_only = tmp_path / name
    table_only.mkdir()
    (table_only / "suite.md").write_text((published / "suite.md").read_text())
    from_json = read_suite_result(published)
    from_table = read_suite_result(table_only)
    assert from_table.name == from_json.name == name
    assert list(from_table.claims) == list(from_json.claims)
    for text, want in from_json.claims.items():
        got = from_table.claims[text]
        for key in ("role", "estimate", "ci", "seed_ci", "per_seed_text", "floor_text",
                    "verdict", "reason"):
            assert got[key] == want[key], (text, key)
    if name == "fedmkt_transfer":  # its reasons were written as "|estimate| below ..."
        assert any("|" in c["reason"] for c in from_json.claims.values())
    assert from_table.environment == from_json.environment


def test_a_table_without_claims_is_refused(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "suite.md").write_text("# Suite x\n\n- environment: y\n")
    with pytest.raises(ValueError, match="no Claims table"):
        read_suite_result(folder)


# --------------------------------------------------------------- what across refuses


def _json_folder(root: Path, name: str, text: str) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "suite.json").write_text(text)
    return folder


def test_a_nan_verdict_is_refused_naming_file_and_field(tmp_path):
    good = _folder(tmp_path, "good", [_claim(PRIMARY, "reproduced", "primary")], [])
    text = json.dumps({"name": "demo", "claims": [{"claim": PRIMARY, "estimate": "+0.1",
                                                   "ci": "[0, 1]", "verdict": float("nan")}]})
    assert "NaN" in text
    bad = _json_folder(tmp_path, "bad", text)
    with pytest.raises(ValueError, match=r"bad/suite.json: claims\[0\]\.verdict"):
        across_report([good, bad])


def test_a_claim_without_estimate_is_refused_naming_file_and_field(tmp_path):
    good = _folder(tmp_path, "good", [_claim(PRIMARY, "reproduced", "primary")], [])
    row = _claim(PRIMARY, "reproduced", "primary")
    del row["estimate"]
    bad = _folder(tmp_path, "bad", [row], [])
    with pytest.raises(ValueError, match=r"bad/suite.json: claims\[0\]\.estimate"):
        across_report([good, bad])


@pytest.mark.parametrize("estimate", ["nan", "NaN", float("nan"), "inf"])
def test_a_nan_estimate_does_not_pass_through(tmp_path, estimate):
    row = _claim(PRIMARY, "reproduced", "primary")
    row["estimate"] = estimate
    bad = _folder(tmp_path, "bad", [row], [])
    with pytest.raises(ValueError, match=r"claims\[0\]\.estimate.*finite"):
        read_suite_result(bad)


def test_a_deeply_nested_file_is_refused_not_a_recursion_error(tmp_path):
    bad = _json_folder(tmp_path, "deep", "[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match="deep/suite.json: .*nested"):
        read_suite_result(bad)


def test_a_string_environment_is_refused(tmp_path, capsys):
    good = _folder(tmp_path, "good", [_claim(PRIMARY, "reproduced", "primary")], [])
    bad = _folder(tmp_path, "bad", [_claim(PRIMARY, "reproduced", "primary")],
                  "- environment: x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bad/suite.json: environment: .*list"):
        across_report([good, bad])
    assert main(["suite", "across", str(good), str(bad)]) == 2
    assert "environment" in capsys.readouterr().err


def test_newlines_and_markdown_in_a_claim_cannot_inject_headings(tmp_path):
    good = _folder(tmp_path, "good", [_claim(PRIMARY, "reproduced", "primary")], [])
    evil = _claim(PRIMARY + "\n# Injected heading", "reproduced", "primary")
    bad = _folder(tmp_path, "bad", [evil], [])
    with pytest.raises(ValueError, match=r"bad/suite.json: claims\[0\]\.claim"):
        across_report([good, bad])
    # a reason with a newline is printed on one line
    why = _claim(PRIMARY, "fragile", "primary", reason="2 seeds\n## Injected\n| x |")
    a = _folder(tmp_path, "a", [why], [])
    text = across_report([good, a])
    assert not any(line.startswith("#") and "Injected" in line for line in text.splitlines())


def test_a_row_after_the_claims_table_is_not_a_claim(tmp_path):
    published = ROOT / "docs" / "suites" / "fedmkt_transfer"
    folder = tmp_path / "fedmkt_transfer"
    folder.mkdir()
    text = (published / "suite.md").read_text()
    extra = ("| secondary | a.server.accuracy > b.server.accuracy | +0.5 | [+0.4, +0.6] | - "
             "| +0.5 | 0.1 | reproduced |")
    lines = text.splitlines()
    start = lines.index("## Claims")
    end = next(i for i in range(start + 4, len(lines)) if not lines[i].startswith("|"))
    lines[end:end] = ["", "Notes.", "", extra]  # after the table, separated from it
    (folder / "suite.md").write_text("\n".join(lines) + "\n")
    assert "a.server.accuracy > b.server.accuracy" not in read_suite_result(folder).claims


def test_a_suite_with_folds_lists_its_differences_per_fold(tmp_path):
    """Seeds inside folds: each listed difference is a fold's, and both the across table
    and the results page head it so (a suite without folds keeps "per seed")."""
    from fedkt.evidence.results import _claims_table

    env = ["- environment: torch 2.13.0; CPU AVX2"]
    by_seed = _folder(tmp_path, "seeds", [_claim(PRIMARY, "reproduced", "primary")], env)
    by_fold = _folder(tmp_path, "folds", [_claim(PRIMARY, "reproduced", "primary")],
                      ["- environment: torch 2.13.0; CPU AVX512 (amx_bf16)"])
    data = json.loads((by_fold / "suite.json").read_text())
    data["folds"] = {"1000": 0, "2000": 0, "1001": 1, "2001": 1}
    (by_fold / "suite.json").write_text(json.dumps(data))
    seeds, folds = read_suite_result(by_seed), read_suite_result(by_fold)
    assert (seeds.unit, folds.unit) == ("seed", "fold")
    row = next(x for x in across_report([str(by_seed), str(by_fold)]).splitlines()
               if x.startswith("| primary"))
    assert "; per seed +0.1" in row.split("|")[3] and "; per fold +0.1" in row.split("|")[4]
    assert "| 95% CI (items, seeds) | per seed |" in _claims_table(seeds)
    assert "| 95% CI (items, seeds, folds) | per fold |" in _claims_table(folds)
    # a folder that kept only its table: read from the table's own heading
    (by_fold / "suite.json").unlink()
    (by_fold / "suite.md").write_text(
        "# Suite demo\n\n## Claims\n\n| | claim | estimate | 95% CI (items, seeds, folds) | "
        "folds' 95% t-interval | per fold | floor | verdict |\n|---|---|---|---|---|---|---|"
        f"---|\n| primary | {PRIMARY} | +0.1000 | [+0.0100, +0.2000] | [+0.0, +0.2] | +0.1 | "
        "0.05 | reproduced |\n")
    assert read_suite_result(by_fold).unit == "fold"


def test_each_published_across_table_is_what_its_folders_generate(monkeypatch):
    """docs/suites/*/across.md: regenerating each from the folders its header names, with
    the same labels, gives the file as committed."""
    import re

    from fedkt.evidence.across import across_report

    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    tables = sorted((root / "docs" / "suites").glob("*/across.md"))
    assert tables
    for table in tables:
        text = table.read_text()
        specs = [f"{label}={folder}" for label, folder in
                 re.findall(r"^\d+\. \*\*(.+?)\*\* \(`(.+?)`\)$", text, re.MULTILINE)]
        assert len(specs) >= 2, table
        assert across_report(specs) == text, (
            f"{table} differs from its folders: run `fedkt suite across "
            f"{' '.join(specs)} -o {table.relative_to(root)}`")
