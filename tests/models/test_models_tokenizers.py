"""Tiny-preset tokenizers: trained on the project's text, different per family, cached."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedkt.models import ModelError, ensure_pad_token, load_tiny_tokenizer
from fedkt.models import tokenizers as tk
from fedkt.models.tiny import TINY_PRESETS

CAUSAL = sorted(TINY_PRESETS)
SENTENCE = "Hello, Mr. Smith! I'd like 12345 apples at 3:30 p.m., please. Thanks, doctor."
UNICODE = "Café au lait — naïve 😀 résumé."


@pytest.fixture(scope="module")
def toks():
    return {name: load_tiny_tokenizer(name) for name in [*CAUSAL, "tiny-bert"]}


@pytest.mark.parametrize("name", CAUSAL)
def test_round_trip(toks, name):
    tok = toks[name]
    for text in (SENTENCE, UNICODE, "#Person1#: Hi.\n#Person2#: Hello there!"):
        ids = tok(text)["input_ids"]
        assert tok.decode(ids, skip_special_tokens=True) == text


def test_bert_wordpiece_round_trip(toks):
    tok = toks["tiny-bert"]
    enc = tok("the weather is nice today", "see you tomorrow")
    tokens = tok.convert_ids_to_tokens(enc["input_ids"])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    assert enc["token_type_ids"][-1] == 1 and enc["token_type_ids"][0] == 0
    ids = tok("The Weather is NICE")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "the weather is nice"


def test_vocab_sizes_match_specs_and_differ(toks):
    sizes = {name: len(toks[name]) for name in CAUSAL}
    assert sizes == {name: tk.TINY_TOKENIZERS[name].vocab_size for name in CAUSAL}
    assert len(set(sizes.values())) == len(CAUSAL)


def test_same_sentence_tokenised_differently(toks):
    seqs = {name: tuple(toks[name].tokenize(SENTENCE)) for name in CAUSAL}
    assert len(set(seqs.values())) == len(CAUSAL)
    ids = {name: tuple(toks[name](SENTENCE)["input_ids"]) for name in CAUSAL}
    assert len(set(ids.values())) == len(CAUSAL)


def test_family_conventions(toks):
    gpt2, opt, llama = toks["tiny-gpt2"], toks["tiny-opt"], toks["tiny-llama"]
    bloom, qwen = toks["tiny-bloom"], toks["tiny-qwen2"]
    assert any(t.startswith("Ġ") for t in gpt2.tokenize("hello there world"))
    assert any(t.startswith("▁") for t in llama.tokenize("hello there world"))
    # OPT prepends </s>, Llama <s>; GPT-2, BLOOM and Qwen2 add nothing.
    assert opt.convert_ids_to_tokens(opt("hi")["input_ids"])[0] == "</s>"
    assert llama.convert_ids_to_tokens(llama("hi")["input_ids"])[0] == "<s>"
    for tok in (gpt2, bloom, qwen):
        assert tok.convert_ids_to_tokens(tok("hi")["input_ids"])[0] not in tok.all_special_tokens
    assert opt.bos_token == opt.eos_token == "</s>" and opt.pad_token == "<pad>"
    assert qwen.eos_token == "<|endoftext|>" and qwen.bos_token is None
    assert bloom.pad_token == "<pad>" and bloom.unk_token == "<unk>"
    # Qwen-style: one digit per token; Llama-style: unknown characters fall back to bytes.
    assert qwen.tokenize("2024") == ["2", "0", "2", "4"]
    assert "<0xF0>" in llama.tokenize("😀")
    assert llama.convert_tokens_to_ids("<0x00>") == 3
    for tok in toks.values():
        assert tok.pad_token is not None and tok.pad_token_id is not None


def test_vocab_size_override():
    tok = load_tiny_tokenizer("tiny-gpt2", vocab_size=1000)
    assert len(tok) == 1000
    assert tok.decode(tok(SENTENCE)["input_ids"]) == SENTENCE
    with pytest.raises(ModelError, match="too small"):
        load_tiny_tokenizer("tiny-gpt2", vocab_size=10)
    with pytest.raises(ModelError, match="tiny-gpt2"):
        load_tiny_tokenizer("tiny-nope")


def test_training_is_cached_once(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path))
    folder = tk.tiny_tokenizer_dir("tiny-qwen2")
    assert folder.parent == tmp_path / "tokenizers" and (folder / "tokenizer.json").is_file()
    mtime = (folder / "tokenizer.json").stat().st_mtime_ns

    def boom(spec, texts):
        raise AssertionError("retrained although cached")

    spec = tk.TINY_TOKENIZERS["tiny-qwen2"]
    monkeypatch.setitem(tk.TINY_TOKENIZERS, "tiny-qwen2", dataclasses.replace(spec, build=boom))
    assert tk.tiny_tokenizer_dir("tiny-qwen2") == folder
    assert (
        load_tiny_tokenizer("tiny-qwen2").decode(
            load_tiny_tokenizer("tiny-qwen2")(SENTENCE)["input_ids"]
        )
        == SENTENCE
    )
    assert (folder / "tokenizer.json").stat().st_mtime_ns == mtime
    # A different vocabulary size is a different cache entry (and would train).
    with pytest.raises(AssertionError, match="retrained"):
        tk.tiny_tokenizer_dir("tiny-qwen2", 1500)


def test_training_is_deterministic_across_processes(tmp_path, monkeypatch):
    """Server and clients train their tokenizers separately: they must agree bit for bit."""
    names = ["tiny-llama", "tiny-bert", "tiny-opt"]
    here = tmp_path / "here"
    monkeypatch.setenv("FEDKT_CACHE", str(here))
    mine = {n: (tk.tiny_tokenizer_dir(n) / "tokenizer.json").read_bytes() for n in names}
    there = tmp_path / "there"
    code = (
        "import sys; from fedkt.models.tokenizers import tiny_tokenizer_dir as d\n"
        "for n in sys.argv[1:]: print(d(n))"
    )
    env = {**os.environ, "FEDKT_CACHE": str(there), "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, *names], env=env, capture_output=True, text=True, check=True
    )
    folders = [Path(line) for line in out.stdout.split()]
    assert [f.parent for f in folders] == [there / "tokenizers"] * len(names)
    for name, folder in zip(names, folders, strict=True):
        assert (folder / "tokenizer.json").read_bytes() == mine[name], name


def test_corpus_prefers_vendored_and_falls_back(tmp_path, monkeypatch):
    texts = tk.corpus_texts()
    assert sum(len(t) for t in texts) > 50_000
    fallback = tk._fallback_texts()
    assert fallback and not any(line.startswith("##") for line in fallback)
    assert "MIT License" in tk.FALLBACK_CORPUS.read_text()
    # No vendored folder: the shipped DialogSum extract is the corpus.
    monkeypatch.setattr(tk, "VENDORED_DIR", tmp_path / "missing")
    assert tk.corpus_texts() == fallback
    digest_fallback = tk.corpus_digest()
    # A vendored folder with enough text is used instead (test files are held out).
    vend = tmp_path / "vendored" / "ds"
    vend.mkdir(parents=True)
    rows = [
        {"text": f"record number {i} says something long enough " * 3, "label": i}
        for i in range(600)
    ]
    (vend / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (vend / "test.jsonl").write_text(json.dumps({"text": "HELD OUT"}) + "\n")
    monkeypatch.setattr(tk, "VENDORED_DIR", tmp_path / "vendored")
    monkeypatch.setattr(tk, "CORPUS_FOLDERS", ("ds",))
    vendored = tk.corpus_texts()
    assert vendored[0] == rows[0]["text"] and "HELD OUT" not in vendored
    digest = tk.corpus_digest()
    assert digest != digest_fallback
    # A dataset vendored later, outside CORPUS_FOLDERS, leaves the corpus as it was.
    late = tmp_path / "vendored" / "later"
    late.mkdir()
    (late / "train.jsonl").write_text(json.dumps({"text": "A LATER DATASET " * 50}) + "\n")
    assert tk.corpus_texts() == vendored and tk.corpus_digest() == digest


def test_ensure_pad_token():
    tok = load_tiny_tokenizer("tiny-llama")
    tok.pad_token = None
    assert tok.pad_token is None
    assert ensure_pad_token(tok).pad_token == "</s>"
    tok = load_tiny_tokenizer("tiny-bert")
    for role in ("pad_token", "eos_token", "unk_token", "bos_token"):
        setattr(tok, role, None)
    with pytest.raises(ModelError, match="no pad"):
        ensure_pad_token(tok)
