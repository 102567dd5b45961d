"""docs/results.md and the README's results summary are generated from docs/suites
(fedkt.evidence.results): regenerating them gives the files as committed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fedkt.evidence import results

ROOT = Path(__file__).resolve().parents[2]
SUITES = ROOT / "docs" / "suites"


def test_results_page_is_what_the_suites_generate():
    want = results.results_markdown(SUITES)
    assert (ROOT / "docs" / "results.md").read_text() == want, (
        "docs/results.md differs from docs/suites: run "
        "`python -m fedkt.evidence.results docs/suites > docs/results.md`")


def test_readme_summary_is_what_the_suites_generate():
    readme = (ROOT / "README.md").read_text()
    assert results.replace_block(readme, results.readme_summary(SUITES)) == readme, (
        "README.md's results block differs from docs/suites: run "
        "`python -m fedkt.evidence.results docs/suites --readme README.md`")


def test_a_changed_number_in_a_suite_changes_the_page_and_the_readme(tmp_path):
    for name in ("clinc150_fedcollm_transfer", "fedmkt_hetero"):  # suite.json; suite.md only
        shutil.copytree(SUITES / name, tmp_path / name)
    before = results.results_markdown(tmp_path), results.readme_summary(tmp_path)
    path = tmp_path / "clinc150_fedcollm_transfer" / "suite.json"
    data = json.loads(path.read_text())
    assert data["claims"][0]["role"] == "primary"
    data["claims"][0]["estimate"] = "+0.9876"
    path.write_text(json.dumps(data))
    after = results.results_markdown(tmp_path), results.readme_summary(tmp_path)
    for old, new in zip(before, after, strict=True):
        assert "+0.9876" in new and "+0.9876" not in old


def test_provenance_is_read_from_the_suites_comment_once_per_table(tmp_path):
    folder = tmp_path / "s"
    shutil.copytree(SUITES / "fedcollm_labelled", folder)
    got = results.provenance(folder, ["- environment: torch 2.13.0+cpu; CPU AVX2"])
    assert got.command == "fedkt suite run suites/fedcollm_labelled --jobs 2"
    assert (got.commit, got.date, got.time) == ("6812971", "2026-11-28 15:58-16:24 UTC",
                                                "25 min 38 s")
    assert got.machine == "a 2-core AMD EPYC with AVX2 only"
    assert results.kernels(got.environment) == "fp32, AVX2"
    text = results.results_markdown(tmp_path)
    assert text.count("Provenance:") == 1 and "commit `6812971`" in text
    table = folder / "suite.md"
    table.write_text("\n".join(table.read_text().splitlines()[1:]))  # no comment
    assert "commit not recorded" in results.results_markdown(tmp_path)


def test_a_suite_run_over_several_days_keeps_its_whole_date_span(tmp_path):
    folder = tmp_path / "s"
    shutil.copytree(SUITES / "fedcollm_labelled", folder)
    table = folder / "suite.md"
    lines = table.read_text().splitlines()
    lines[0] = ("<!-- `fedkt suite run suites/fedcollm_labelled --jobs 2` at commit 6812971, "
                "2026-12-05 08:30:52 UTC to 2026-12-06 13:15:20 UTC, a 2-core Intel Xeon "
                "with AMX, 10 h 41 min 35 s wall in all -->")
    table.write_text("\n".join(lines))
    got = results.provenance(folder)
    assert got.date == "2026-12-05 08:30:52 UTC to 2026-12-06 13:15:20 UTC"
    assert got.time == "10 h 41 min 35 s" and got.machine == "a 2-core Intel Xeon with AMX"


def test_the_kernels_of_an_environment_line_follow_its_onednn_cap():
    """The native kinds by their flags; an emulated one (``ONEDNN_MAX_CPU_ISA``) by the
    kernels its cap leaves, on its host: a suite emulated on the AMX host gets its own
    column, not the native AMX one."""
    amx = "torch 2.13.0+cpu; CPU AVX512 (avx512_bf16, amx_bf16, amx_int8, amx_tile)"
    cases = {
        amx: "bf16, AMX",
        "torch 2.13.0+cpu; CPU AVX512 (avx512_bf16), on AMD EPYC": "bf16, AVX512-BF16",
        "torch 2.13.0+cpu; CPU AVX2, on AMD EPYC": "fp32, AVX2",
        f"{amx}, ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16, on Intel(R) Xeon(R)":
            "bf16, AVX512-BF16 kernels on the AMX host",
        f"{amx}, ONEDNN_MAX_CPU_ISA=AVX2": "fp32, AVX2 kernels on the AMX host",
        f"{amx}, ONEDNN_MAX_CPU_ISA=AVX512_CORE_AMX": "bf16, AMX",
        "torch; CPU AVX512 (avx512_bf16), ONEDNN_MAX_CPU_ISA=AVX512_CORE":
            "fp32, AVX512 kernels on the AVX512-BF16 host",
        "torch 2.13.0+cpu; CPU AVX2 (avx512_bf16, amx_bf16, amx_int8, amx_tile)":
            "bf16, AMX (ATen AVX2) kernels on the AMX host",
        "torch; CPU AVX2 (avx512_bf16, amx_bf16), ONEDNN_MAX_CPU_ISA=AVX2":
            "fp32, AVX2 kernels on the AMX host",
        "torch 2.13.0+cpu": results.NOT_RECORDED,
    }
    assert {line: results.kernels(line) for line in cases} == cases


def test_the_kernels_of_an_environment_line_follow_its_recorded_precision():
    """A line that records the arithmetic (a run's resolved ``training.precision``) is
    placed by it, not by what ``auto`` would pick: a pinned fp32 suite on the AMX host
    gets its own column, and ``auto``, recorded or not, the kind's."""
    amx = "torch 2.13.0+cpu; CPU AVX512 (avx512_bf16, amx_bf16, amx_int8, amx_tile)"
    epyc = "torch 2.13.0+cpu; CPU AVX512 (avx512_bf16), on AMD EPYC"
    cases = {
        f"{amx}; precision bf16 (auto)": "bf16, AMX",
        f"{amx}; precision bf16 (pinned)": "bf16, AMX",
        f"{amx}; precision fp32 (pinned)": "fp32, AVX512 kernels on the AMX host",
        f"{epyc}; precision fp32 (pinned)": "fp32, AVX512 kernels on the AVX512-BF16 host",
        f"{epyc}; precision bf16 (auto)": "bf16, AVX512-BF16",
        "torch; CPU AVX2, on AMD EPYC; precision fp32 (auto)": "fp32, AVX2",
        "torch; CPU AVX2, on AMD EPYC; precision bf16 (pinned)": "bf16 (emulated), AVX2",
        f"{amx}, ONEDNN_MAX_CPU_ISA=AVX2; precision bf16 (pinned)":
            "bf16 (emulated), AVX2 kernels on the AMX host",
    }
    assert {line: results.kernels(line) for line in cases} == cases


def test_a_wall_time_is_the_comments_wall_duration_with_its_qualifier(tmp_path):
    """Of a comment's durations, the wall time is the one it calls wall; one put together
    afterwards keeps its "about" or "at least"; a comment that calls none wall records
    none."""
    folder = tmp_path / "s"
    folder.mkdir()

    def time_of(comment: str) -> str:
        (folder / "suite.md").write_text(f"<!-- {comment} -->\n\n# Suite s\n")
        return results.provenance(folder).time

    assert time_of("fold 0 65 min, fold 1 84 min, 2 h 29 min wall in all") == "2 h 29 min"
    assert time_of("(2 h 7 min 12 s of the third sitting); 64 runs, about 5 h 28 min wall "
                   "in all") == "about 5 h 28 min"
    assert time_of("64 runs, at least 5 h 28 min wall in all") == "at least 5 h 28 min"
    assert time_of("fold 0 65 min, fold 1 84 min, 2 h 29 min in all") == results.NOT_RECORDED
    assert "wall time: at least 5 h 28 min" in results.results_markdown(SUITES)


def test_the_readme_shows_the_suites_that_decide_and_the_page_every_suite(tmp_path):
    """A suite split by fold that is not a pilot is on the README; a suite of seeds
    without folds, and a pilot, are only on docs/results.md."""
    names = ("clinc150_fedmkt_transfer", "clinc150_fedmkt_pilot", "fedmkt_keep")
    for name in names:
        shutil.copytree(SUITES / name, tmp_path / name)
    page, readme = results.results_markdown(tmp_path), results.readme_summary(tmp_path)
    assert all(f"| [{n}](" in page for n in names)
    assert [n for n in names if f"| [{n}](" in readme] == ["clinc150_fedmkt_transfer"]
    # folds, not the name, decide: the same folder without its folds leaves the README
    path = tmp_path / "clinc150_fedmkt_transfer" / "suite.json"
    data = json.loads(path.read_text())
    data["folds"] = None
    path.write_text(json.dumps(data))
    assert "| [clinc150_fedmkt_transfer](" not in results.readme_summary(tmp_path)


def _primary_row(text: str, name: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| [{name}]"))
    return [c.strip() for c in line.strip("|").split(" | ")]


def test_a_suite_under_two_settings_shows_its_word_across_them_and_the_pooled_verdict(
        tmp_path):
    """The summary's last two cells are `fedkt suite across`'s primary row: here fp32's
    reproduced against bf16's not resolved, and Student's t over the four fold means."""
    from scipy.stats import t as student_t

    for name in ("fedmkt_transfer", "fedmkt_transfer_bf16", "fedmkt_iid_keep"):
        shutil.copytree(SUITES / name, tmp_path / name)
    per_fold = [json.loads((tmp_path / n / "suite.json").read_text())["claims"][0]["per_seed"]
                for n in ("fedmkt_transfer", "fedmkt_transfer_bf16")]
    means = [(per_fold[0][k] + per_fold[1][k]) / 2 for k in "0123"]
    mean = sum(means) / 4
    sd = (sum((m - mean) ** 2 for m in means) / 3) ** 0.5
    half = student_t.ppf(0.975, 3) * sd / 2
    row = _primary_row(results.results_markdown(tmp_path), "fedmkt_transfer")
    assert row[-2] == "differs: reproduced / not resolved"
    assert row[-1] == f"not resolved: {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}]"
    # one setting only: nothing to compare
    assert _primary_row(results.results_markdown(tmp_path), "fedmkt_iid_keep")[-2:] == ["-", "-"]
    # a setting that ran fewer folds (`fedkt suite run --fold`): pooled on the folds both
    # ran, named; three of them decide nothing (a verdict needs 4 folds)
    path = tmp_path / "fedmkt_transfer_bf16" / "suite.json"
    data = json.loads(path.read_text())
    data["claims"][0]["per_seed"] = {k: per_fold[1][k] for k in "012"}
    path.write_text(json.dumps(data))
    row = _primary_row(results.results_markdown(tmp_path), "fedmkt_transfer")
    means = [(per_fold[0][k] + per_fold[1][k]) / 2 for k in "012"]
    assert row[-1].startswith(f"not resolved: {sum(means) / 3:+.4f} [")
    assert row[-1].endswith(" (folds 0, 1, 2, those every setting ran)")
    # folds no two settings share: not pooled
    data["claims"][0]["per_seed"] = {"7": 0.1, "8": 0.2, "9": 0.3}
    path.write_text(json.dumps(data))
    row = _primary_row(results.results_markdown(tmp_path), "fedmkt_transfer")
    assert row[-1] == "not computed: the folds differ between settings"


def test_the_pooled_verdict_moves_with_a_setting_s_fold_differences(tmp_path):
    for name in ("fedmkt_transfer", "fedmkt_transfer_bf16"):
        shutil.copytree(SUITES / name, tmp_path / name)
    path = tmp_path / "fedmkt_transfer_bf16" / "suite.json"
    data = json.loads(path.read_text())
    claim = data["claims"][0]
    claim["per_seed"] = dict(json.loads((tmp_path / "fedmkt_transfer" / "suite.json")
                                        .read_text())["claims"][0]["per_seed"])
    claim["verdict"] = "reproduced"
    path.write_text(json.dumps(data))
    row = _primary_row(results.results_markdown(tmp_path), "fedmkt_transfer")
    assert row[-2] == "reproduced under both"
    assert row[-1].startswith("reproduced: +0.3507 [")  # both settings' own folds: fp32's
