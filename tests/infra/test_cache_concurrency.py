"""Concurrent use of the on-disk cache (fedkt/infra/cache.py): processes racing on one entry.

Children are started with the ``spawn`` context, so each is a fresh interpreter like a
separate ``fedkt run``; module-level imports stay light because every child imports
this module. A ``multiprocessing`` barrier makes the racers start together, and a
patched :meth:`CacheBuild.publish` sleeps before the rename, so the second process
arrives while the first is still writing.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedkt.infra import cache as fc

CTX = multiprocessing.get_context("spawn")
DELAY = 0.5  # seconds a patched publish waits before renaming
CHUNKS = [bytes([i]) * 4096 for i in range(16)]
WHOLE = b"".join(CHUNKS)


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if ".tmp-" in p.name]


def _lock_is_free(path: Path) -> bool:
    import fcntl

    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _read(p: Path) -> bytes:
    return p.read_bytes()


def _write_in_chunks(tmp: Path, pause: float = 0.03) -> bytes:
    with tmp.open("wb") as fh:
        for chunk in CHUNKS:
            fh.write(chunk)
            fh.flush()
            time.sleep(pause)
    return WHOLE


def _write_folder_in_chunks(tmp: Path, pause: float = 0.03) -> Path:
    tmp.mkdir()
    for i, chunk in enumerate(CHUNKS):
        (tmp / f"part{i:02d}.bin").write_bytes(chunk)
        time.sleep(pause)
    return tmp


def _read_folder(folder: Path) -> Path:
    for i, chunk in enumerate(CHUNKS):
        if (folder / f"part{i:02d}.bin").read_bytes() != chunk:
            raise ValueError(f"{folder} part {i} differs")
    return folder


# ------------------------------------------------------------------- the primitive


def test_a_crashing_builder_leaves_no_entry_and_a_later_call_builds(tmp_path):
    path = tmp_path / "entry.bin"

    def crash(tmp: Path) -> bytes:
        tmp.write_bytes(WHOLE[:1000])
        raise RuntimeError("builder died")

    with pytest.raises(RuntimeError, match="builder died"):
        fc.cached(path, crash, _read)
    assert not path.exists() and not _leftovers(tmp_path) and _lock_is_free(path)
    assert fc.cached(path, _write_in_chunks, _read) == WHOLE
    assert path.read_bytes() == WHOLE
    # Present and usable: no build at all.
    assert fc.cached(path, crash, _read) == WHOLE


def test_an_unusable_entry_is_rebuilt_and_replaced(tmp_path):
    path = tmp_path / "folder"
    path.mkdir()
    (path / "part00.bin").write_bytes(b"stale")  # e.g. written by a broken old version
    assert fc.cached(path, _write_folder_in_chunks, _read_folder) == path
    assert sorted(p.name for p in path.iterdir()) == [f"part{i:02d}.bin" for i in range(16)]
    assert not _leftovers(tmp_path)


def test_a_build_that_writes_nothing_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="wrote nothing"):
        fc.cached(tmp_path / "x.npy", lambda tmp: None, _read)
    assert not (tmp_path / "x.npy").exists()


def _hang_while_building(path: str, started: str) -> None:
    def build(tmp: Path) -> bytes:
        tmp.write_bytes(WHOLE[:5000])
        Path(started).write_text(str(tmp))
        time.sleep(60)
        return WHOLE

    fc.cached(Path(path), build, _read)


def test_a_killed_builder_releases_the_lock_and_its_leftovers_are_cleaned(tmp_path):
    path, started = tmp_path / "entry.bin", tmp_path / "started"
    child = CTX.Process(target=_hang_while_building, args=(str(path), str(started)))
    child.start()
    try:
        deadline = time.time() + 30
        while not started.exists() and time.time() < deadline:
            time.sleep(0.02)
        assert started.exists(), "the child never started building"
        assert not _lock_is_free(path)  # held while it builds
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    stale = Path(started.read_text())
    assert stale.exists() and not path.exists()  # a partial temporary, never the entry
    assert _lock_is_free(path)  # the kernel released the dead builder's lock
    assert fc.cached(path, _write_in_chunks, _read) == WHOLE
    assert not stale.exists() and not _leftovers(tmp_path)


def _build_slowly(file_entry: str, folder_entry: str, log: str, barrier: Any) -> None:
    """Build (or wait for) both entries; log each build."""

    def logged(build):
        def run(tmp: Path):
            with open(log, "a") as fh:
                fh.write(f"{os.getpid()} {tmp.name}\n")
            return build(tmp)
        return run

    barrier.wait(timeout=60)
    assert fc.cached(Path(file_entry), logged(_write_in_chunks), _read) == WHOLE
    assert fc.cached(Path(folder_entry), logged(_write_folder_in_chunks), _read_folder)


def test_readers_never_see_a_partial_entry_and_racers_build_once(tmp_path):
    """Two builders race; meanwhile this process polls the entries as a plain reader."""
    file_entry, folder_entry, log = tmp_path / "e.bin", tmp_path / "f", tmp_path / "log"
    barrier = CTX.Barrier(3)
    kids = [CTX.Process(target=_build_slowly, args=(str(file_entry), str(folder_entry),
                                                    str(log), barrier)) for _ in range(2)]
    for k in kids:
        k.start()
    barrier.wait(timeout=60)
    seen = {"missing": 0, "file": 0, "folder": 0}
    while any(k.is_alive() for k in kids):
        if file_entry.exists():
            assert file_entry.read_bytes() == WHOLE
            seen["file"] += 1
        else:
            seen["missing"] += 1
        if folder_entry.exists():
            _read_folder(folder_entry)  # every part present and complete
            seen["folder"] += 1
        time.sleep(0.002)
    assert [k.exitcode for k in kids] == [0, 0]
    # The polling overlapped both builds: it saw the file missing, then complete while
    # the folder was still missing (being built); every entry it saw was complete.
    assert seen["missing"] > 10 and seen["file"] - seen["folder"] > 10
    _read_folder(folder_entry)
    builds = log.read_text().splitlines()
    assert len(builds) == 2 and {b.split()[1].split(".tmp-")[0] for b in builds} == {
        ".e.bin", ".f"}  # each entry built exactly once
    assert not _leftovers(tmp_path)


# ------------------------------------------------------------------- fedkt's caches


def _race_child(cache: str, gguf: str, out: str, go: Any, barrier: Any) -> None:
    """One of two racers: every step builds a cold cache entry."""
    os.environ["FEDKT_CACHE"] = cache
    import torch

    torch.set_num_threads(1)
    from fedkt.alignment.sequence import align_corpus
    from fedkt.alignment.vocab import vocab_mapping
    from fedkt.models.causal_lm import gguf_float_dir
    from fedkt.models.tokenizers import corpus_texts, load_tiny_tokenizer

    events: list[dict[str, Any]] = []
    publish = fc.CacheBuild.publish

    def slow_publish(self: fc.CacheBuild) -> None:
        t0 = time.time()
        time.sleep(DELAY)  # still "writing": the entry is not there yet
        publish(self)
        events.append({"entry": self.path.name, "t0": t0, "t1": time.time()})

    fc.CacheBuild.publish = slow_publish  # type: ignore[method-assign]
    assert go.wait(timeout=180)  # the GGUF file is written
    steps: dict[str, list[float]] = {}
    results: dict[str, np.ndarray] = {}

    def step(name: str, fn):
        barrier.wait(timeout=120)
        start = time.time()
        value = fn()
        steps[name] = [start, time.time()]
        return value

    toks = step("tokenizers", lambda: (load_tiny_tokenizer("tiny-gpt2"),
                                       load_tiny_tokenizer("tiny-llama")))
    folder = step("gguf", lambda: gguf_float_dir(Path(gguf).parent, Path(gguf).name))
    results["mapping"] = step("mapping", lambda: vocab_mapping(*toks))
    aligns = step("alignment", lambda: align_corpus(corpus_texts()[:40], *toks))
    for field in ("src_to_tgt", "tgt_to_src", "logit_map", "logit_map_reverse"):
        results[field] = np.concatenate([getattr(a, field) for a in aligns])
    np.savez(Path(out) / f"{os.getpid()}.npz", **results)
    (Path(out) / f"{os.getpid()}.json").write_text(
        json.dumps({"events": events, "steps": steps, "gguf": str(folder)}))


def _safetensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.mark.slow  # 32 s idle, 2-core AVX2 (2026-12-03); kept: the store's locking tests
def test_two_runs_racing_on_a_cold_cache_build_each_entry_once(tmp_path, monkeypatch):
    import torch

    from fedkt.alignment.sequence import align_corpus, clear_alignment_cache
    from fedkt.alignment.vocab import vocab_mapping
    from fedkt.models.causal_lm import gguf_float_dir
    from fedkt.models.tokenizers import corpus_texts, load_tiny_tokenizer
    from tests.models.test_models_gguf import _write_tiny_gguf

    race, serial, out = tmp_path / "race", tmp_path / "serial", tmp_path / "out"
    gguf = tmp_path / "ckpt" / "tiny-llama-f32.gguf"
    gguf.parent.mkdir()
    out.mkdir()
    go, barrier = CTX.Event(), CTX.Barrier(2)
    kids = [CTX.Process(target=_race_child, args=(str(race), str(gguf), str(out), go, barrier))
            for _ in range(2)]
    for k in kids:
        k.start()
    try:
        # While the racers start up: the GGUF file, and the same steps run serially on
        # another cold cache, in this process.
        _write_tiny_gguf(gguf)
        go.set()
        monkeypatch.setenv("FEDKT_CACHE", str(serial))
        clear_alignment_cache()
        toks = (load_tiny_tokenizer("tiny-gpt2"), load_tiny_tokenizer("tiny-llama"))
        folder = gguf_float_dir(gguf.parent, gguf.name)
        mapping = vocab_mapping(*toks)
        aligns = align_corpus(corpus_texts()[:40], *toks)
    finally:
        go.set()
        for k in kids:
            k.join(timeout=240)
    assert [k.exitcode for k in kids] == [0, 0]

    logs = [json.loads((out / f"{k.pid}.json").read_text()) for k in kids]
    arrays = [np.load(out / f"{k.pid}.npz") for k in kids]
    # Bit for bit the serial results, in both racers and in the cache they shared.
    for got in arrays:
        assert np.array_equal(got["mapping"], mapping) and got["mapping"].dtype == mapping.dtype
        for field in ("src_to_tgt", "tgt_to_src", "logit_map", "logit_map_reverse"):
            assert np.array_equal(got[field], np.concatenate([getattr(a, field) for a in aligns]))
    for sub in ("tokenizers", "vocab_mapping", "alignments", "gguf-float"):
        mine = sorted(p.name for p in (serial / sub).iterdir() if not p.name.endswith(".lock"))
        theirs = sorted(p.name for p in (race / sub).iterdir() if not p.name.endswith(".lock"))
        assert mine == theirs and mine, sub  # same keys, no stray files
    for tok_dir in (serial / "tokenizers").iterdir():
        if tok_dir.is_dir():
            assert (tok_dir / "tokenizer.json").read_bytes() == (
                race / "tokenizers" / tok_dir.name / "tokenizer.json").read_bytes()
    for sub in ("vocab_mapping", "alignments"):
        for f in (serial / sub).glob("*.np*"):
            assert f.read_bytes() == (race / sub / f.name).read_bytes(), f
    assert all(Path(log["gguf"]) == race / "gguf-float" / folder.name for log in logs)
    theirs = _safetensors(race / "gguf-float" / folder.name)
    mine = _safetensors(folder)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert not _leftovers(race)

    # Each entry was built by exactly one racer; the other arrived while it was being
    # written (before the rename) and returned only after it was published.
    entries = [p.name for sub in ("tokenizers", "gguf-float", "vocab_mapping", "alignments")
               for p in (race / sub).iterdir() if not p.name.endswith(".lock")]
    step_of = {"tokenizers": "tokenizers", "gguf-float": "gguf", "vocab_mapping": "mapping",
               "alignments": "alignment"}
    assert len(entries) == 5
    for sub, step in step_of.items():
        for entry in (race / sub).iterdir():
            if entry.name.endswith(".lock"):
                continue
            built = [(i, e) for i, log in enumerate(logs) for e in log["events"]
                     if e["entry"] == entry.name]
            assert len(built) == 1, (entry.name, built)
            builder, event = built[0]
            start, end = logs[1 - builder]["steps"][step]
            assert start < event["t0"] and end > event["t1"], (entry.name, start, end, event)
