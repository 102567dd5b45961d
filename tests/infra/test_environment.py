"""Where a run's numbers were computed: environment.json, summary.md, suite.md, reuse keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedkt.evidence.suite_report import environment_lines, peak_memory
from fedkt.infra.environment import (
    describe,
    environment,
    kernels,
    setting_line,
    source_digest,
    without_code,
)
from fedkt.infra.memory import peak_rss_mb
from fedkt.infra.precision import resolve_precision
from fedkt.runner import run
from fedkt.runtime import job
from fedkt.tracking.summary import read_environment, summary_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_keeps_its_versions_and_kernels_and_its_summary_names_them(make_config):
    cfg = make_config("rounds=1")
    run(cfg, quiet=True)
    [entry] = read_environment(cfg.run_dir)
    assert entry["from_round"] == 1
    assert entry["torch"] == torch.__version__
    assert entry["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert set(entry["cpu_flags"]) <= {"avx2", "avx512f", "avx512_bf16", "avx512_fp16",
                                       "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"}
    assert entry["code"] == source_digest()
    # the arithmetic: what training.precision resolved to here, which auto leaves to the CPU
    want = {torch.bfloat16: "bf16", None: "fp32"}[resolve_precision(cfg.training.precision,
                                                                    cfg.runtime.device)]
    assert (entry["precision"], entry["autocast"]) == (cfg.training.precision, want)
    summary = (cfg.run_dir / "summary.md").read_text()
    assert describe(entry).endswith(
        f"; precision {want} ({'auto' if cfg.training.precision == 'auto' else 'pinned'})")
    assert f"- environment: fedkt code {entry['code'][:12]}" in summary
    assert f"; torch {torch.__version__}, transformers" in summary
    # the CPU's model name: another vendor's CPU of the same ISA may take other MKL paths
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text(
        ).splitlines() if line.startswith("model name")), None) if Path(
        "/proc/cpuinfo").is_file() else None
    if model:
        assert entry["cpu_model"] == model and f", on {model}" in describe(entry)


def test_a_run_records_its_peak_memory_and_a_resume_keeps_the_larger(make_config):
    cfg = make_config("rounds=2")
    run(cfg, quiet=True)
    [entry] = read_environment(cfg.run_dir)
    now = peak_rss_mb()
    assert now is not None and 0 < entry["peak_rss_mb"] <= now  # this process ran the run
    summary = (cfg.run_dir / "summary.md").read_text()
    assert f"- peak memory: {entry['peak_rss_mb']:,.0f} MB resident" in summary
    path = cfg.run_dir / "environment.json"
    path.write_text(json.dumps([{**entry, "peak_rss_mb": 1e9}]))  # an earlier, larger process
    job._record_environment(cfg.run_dir, 2, cfg)  # resumed on the same machine: no new entry
    job._record_round_end(cfg.run_dir)
    assert [e["peak_rss_mb"] for e in read_environment(cfg.run_dir)] == [1e9]
    path.write_text(json.dumps([{**entry, "peak_rss_mb": 0.5}]))
    before = peak_rss_mb()
    job._record_round_end(cfg.run_dir)
    [kept] = [e["peak_rss_mb"] for e in read_environment(cfg.run_dir)]
    assert before <= kept <= peak_rss_mb()  # this process's, not the smaller one kept
    assert environment_lines([cfg.run_dir]) == [f"- environment: {describe(entry)}"]
    assert peak_memory({"a": [cfg.run_dir], "b": [cfg.run_dir.parent]}) == {"a": kept}


def test_each_process_of_a_run_records_its_span_and_each_round_moves_its_end(make_config):
    """A run's entry holds when each process computed its rounds (``spans``, UTC): one
    for the first process, one more for a resume on the same machine, whose end moves
    with each round; the spans are not the machine (no second entry)."""
    from datetime import UTC, datetime

    before = datetime.now(UTC).replace(microsecond=0)
    cfg = make_config("rounds=2")
    run(cfg, quiet=True)
    after = datetime.now(UTC)
    [entry] = read_environment(cfg.run_dir)
    [[start, end]] = [[datetime.fromisoformat(x) for x in s] for s in entry["spans"]]
    assert before <= start <= end <= after
    job._record_environment(cfg.run_dir, 2, cfg)  # a resume on the same machine
    [entry] = read_environment(cfg.run_dir)
    first, second = ([datetime.fromisoformat(x) for x in s] for s in entry["spans"])
    assert first == [start, end] and second[0] == second[1] >= end
    path = cfg.run_dir / "environment.json"
    entry["spans"][-1] = ["2026-12-05T09:00:00+00:00"] * 2
    path.write_text(json.dumps([entry]))
    job._record_round_end(cfg.run_dir)
    [entry] = read_environment(cfg.run_dir)
    assert entry["spans"][-1][0] == "2026-12-05T09:00:00+00:00"
    assert datetime.fromisoformat(entry["spans"][-1][1]) >= before
    assert entry["spans"][0] == [start.isoformat(), end.isoformat()]


def test_a_run_resumed_elsewhere_records_a_second_environment(make_config, monkeypatch):
    cfg = make_config("rounds=2")
    run(cfg, quiet=True)
    job._record_environment(cfg.run_dir, 2, cfg)  # resumed on the same machine: no new entry
    assert len(read_environment(cfg.run_dir)) == 1
    other = {**environment(), "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]}  # no AMX
    monkeypatch.setattr(job, "environment", lambda: other)
    job._record_environment(cfg.run_dir, 2, cfg)
    first, second = read_environment(cfg.run_dir)
    assert (first["from_round"], second["from_round"]) == (1, 2)
    text = summary_markdown([], {"name": "x"}, cfg.run_dir)
    assert "- environment from round 2: " in text and "(avx512_bf16)" in text


def test_a_suite_names_one_environment_or_warns_of_several(tmp_path):
    env = environment()
    folders = []
    other = sorted(set(env["cpu_flags"]) ^ {"amx_bf16"})  # another machine's, on any machine
    for i, flags in enumerate((env["cpu_flags"], env["cpu_flags"], other)):
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        (folder / "environment.json").write_text(json.dumps(
            [{"from_round": 1, **env, "cpu_flags": flags}]))
        folders.append(folder)
    assert environment_lines(folders[:2]) == [f"- environment: {describe(env)}"]
    lines = environment_lines(folders)
    assert lines[0].startswith("- **runs from 2 environments**")
    assert sorted(line.split(" run(s)")[0].strip() for line in lines[1:]) == ["- 1", "- 2"]


def test_the_reuse_key_changes_with_the_kernels_not_only_the_cpu_capability():
    """AMX and AVX512-BF16 kernels round bf16 differently under one CPU capability
    (AVX512): an entry from one must not be read on the other."""
    code = "from fedkt.eval.reuse import code_digest; print(code_digest())"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=e)
             for e in (env, {**env, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})]  # side by side
    plain, capped = (p.communicate(timeout=300)[0] for p in procs)
    assert [p.returncode for p in procs] == [0, 0]
    assert plain.strip() and capped.strip() and plain != capped
    assert kernels()["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def test_numerics_are_read_when_asked_and_a_run_records_its_clients_threads(make_config,
                                                                            monkeypatch):
    """fedkt.infra.environment.numerics: the threads now (not once per process) and the
    variables that pick kernels; environment.json names the clients' threads."""
    from fedkt.infra.environment import numerics

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = numerics()
        torch.set_num_threads(2)
        two = numerics()
    finally:
        torch.set_num_threads(before)
    assert (one["intra_op_threads"], two["intra_op_threads"]) == (1, 2)
    assert one["inter_op_threads"] == torch.get_num_interop_threads()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert numerics()["kernel_env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert kernels()["kernel_env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    cfg = make_config("rounds=1", "runtime.torch_threads=null", "runtime.local.client_threads=1")
    run(cfg, quiet=True)
    [entry] = read_environment(cfg.run_dir)
    assert (entry["client_threads"], entry["client_workers"]) == (1, 1)
    assert entry["client_threads_from"] == "runtime.local.client_threads=1"


def test_the_reuse_key_holds_every_fedkt_source_file_not_only_the_evaluations():
    """A stored training, distillation or knowledge set is keyed by the code that made it:
    training and alignment sources count, not only fedkt/eval's; fedkt/evidence, which
    reads finished runs, does not (tests/eval/test_reuse.py checks that no entry's build
    runs its code)."""
    import fedkt
    from fedkt.infra.environment import source_files

    package = Path(fedkt.__file__).resolve().parent
    files = source_files()
    readers = set((package / "evidence").rglob("*.py"))
    assert readers and set(files) == set(package.rglob("*.py")) - readers
    for name in ("train/lm.py", "alignment/choices.py", "methods/fedmkt/algorithm.py",
                 "eval/reuse.py", "eval/scorer.py", "runtime/job.py", "config/schema.py"):
        assert package / name in files


def _digest_and_commit(package_root: Path) -> list[str]:
    """:func:`source_digest` and :func:`commit` of the fedkt imported from ``package_root``,
    in a process of its own (both are computed once per process)."""
    code = ("from fedkt.infra.environment import commit, source_digest; "
            "print(source_digest(), commit())")
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120, check=True, cwd=package_root)
    return out.stdout.split()


def test_the_code_is_named_by_its_source_files_and_its_commit(tmp_path):
    """environment.json's ``code`` moves with a source file that computes, not with one of
    fedkt/evidence (it reads finished runs); ``commit`` is the checkout's HEAD, ``+edited``
    once a source file under fedkt/ differs from it (not for the bytecode a run leaves), and
    None outside a git checkout."""
    import shutil

    import fedkt

    package = Path(fedkt.__file__).resolve().parent
    wheel, root = tmp_path / "site-packages", tmp_path / "checkout"
    for path in package.rglob("*.py"):
        for where in (wheel, root):
            copy = where / "fedkt" / path.relative_to(package)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
    plain, named = _digest_and_commit(wheel)
    assert plain == source_digest() and named == "None"  # the same files; not a checkout
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the commit part needs it")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "fedkt"], check=True)
    subprocess.run([*git, "commit", "-qm", "fedkt"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert _digest_and_commit(root) == [plain, head]
    cache = root / "fedkt" / "infra" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "environment.cpython-312.pyc").write_bytes(b"\0")  # untracked, no .gitignore
    assert _digest_and_commit(root) == [plain, head]
    reader = root / "fedkt" / "evidence" / "claims.py"
    reader.write_text(reader.read_text() + "\n# a report's edit\n")
    assert _digest_and_commit(root) == [plain, head + "+edited"]
    subprocess.run([*git, "checkout", "-q", "--", "fedkt"], check=True)
    trainer = root / "fedkt" / "train" / "lm.py"
    trainer.write_text(trainer.read_text() + "\n# an edit that may move a number\n")
    edited, named = _digest_and_commit(root)
    assert edited != plain and named == head + "+edited"
    trainer.unlink()
    (root / "fedkt" / "train" / "new.py").write_text("")  # a new file counts as an edit
    assert _digest_and_commit(root)[1] == head + "+edited"


@pytest.mark.parametrize("commit", [None, "06b79522f0e1c6b2", "339dd24a1b2c3d4e+edited"])
def test_an_environment_line_without_its_code_is_the_line_of_no_code(commit):
    """What ``fedkt suite across`` compares: the same kernels under two commits give the
    same line once the code part is taken off, and nothing else is taken."""
    env = {"torch": "2.13.0+cpu", "transformers": "5.25.0", "peft": "0.21.2",
           "cpu_capability": "AVX512", "cpu_flags": ["amx_bf16", "avx512_bf16"],
           "cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz"}
    named = describe({**env, "code": "21d67268e15c" + "0" * 52, "commit": commit})
    assert named.startswith("fedkt code 21d67268e15c") and named != describe(env)
    assert without_code(named) == describe(env) == without_code(describe(env))


def test_a_setting_line_drops_the_code_and_an_auto_precision_but_not_a_pinned_one():
    """``fedkt suite across`` names two folders one kernel setting where only the code or
    an auto precision's record differs (auto follows from the CPU); a pinned one differs."""
    env = {"torch": "2.13.0+cpu", "transformers": "5.25.0", "peft": "0.21.2",
           "cpu_capability": "AVX512", "cpu_flags": ["avx512_bf16"], "cpu_model": "AMD EPYC"}
    auto = describe({**env, "code": "ab" * 32, "precision": "auto", "autocast": "bf16"})
    pinned = describe({**env, "precision": "fp32", "autocast": "fp32"})
    assert auto.endswith("; precision bf16 (auto)") and pinned.endswith("(pinned)")
    assert setting_line(auto) == setting_line(describe(env)) == describe(env)
    assert setting_line(pinned) == pinned != describe(env)


def test_library_versions_are_named_without_importing_transformers():
    """`fedkt suite status` reads runs only: naming the libraries must not import
    transformers or peft (seconds), and must name the versions an import gives."""
    code = ("import sys, json; from fedkt.infra.environment import libraries; v = libraries(); "
            "print(json.dumps([v, 'transformers' in sys.modules, 'peft' in sys.modules]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300, check=True).stdout
    versions, transformers_imported, peft_imported = json.loads(out)
    assert not transformers_imported and not peft_imported
    import peft
    import transformers

    assert versions == {"torch": torch.__version__, "transformers": transformers.__version__,
                        "peft": peft.__version__}
