"""Progress bars of evaluation, knowledge sets and alignment (fedkt.infra.progress).

Each bar is labelled with its participant, counts every item once, shows a rate in
items/s on a terminal, and writes nothing when stderr is not a terminal.
"""

from __future__ import annotations

import io
import sys

import pytest
from tqdm import tqdm

from fedkt.alignment import align_corpus, clear_alignment_cache
from fedkt.alignment.knowledge import PublicSet, knowledge_set
from fedkt.eval.evaluate import evaluate_causal_lm
from fedkt.eval.scorer import score_choices, target_loss
from fedkt.infra import progress
from fedkt.models.tiny import build_tiny_causal_lm
from fedkt.train.lm import LM


class Terminal(io.StringIO):
    """A stderr that says it is a terminal (as a user's shell is)."""

    def isatty(self) -> bool:
        return True


class Recorded(tqdm):
    """tqdm that remembers every bar it made: its label, total and final count."""

    made: list[Recorded] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


@pytest.fixture
def bars(monkeypatch):
    """The bars a test makes."""
    Recorded.made = []
    monkeypatch.setattr(progress, "tqdm", Recorded)
    return Recorded.made


def on_terminal(monkeypatch) -> Terminal:
    """stderr as a terminal, for the rest of the test (pytest resets it after fixtures;
    a bar that is not shown counts nothing)."""
    out = Terminal()
    monkeypatch.setattr(sys, "stderr", out)
    return out


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = build_tiny_causal_lm("tiny-gpt2")
    return model, tokenizer


RECORDS = [{"id": str(i), "text": f"please play song number {i} now", "label": i % 3}
           for i in range(24)]
LABELS = ["play music", "book a restaurant", "weather"]


def test_evaluation_bar_is_labelled_counts_every_item_and_shows_items_per_second(
        tiny, bars, monkeypatch):
    model, tokenizer = tiny
    out = on_terminal(monkeypatch)
    with progress.participant("client_1"):
        evaluate_causal_lm(model, tokenizer, RECORDS, "classification", LABELS, batch_size=8)
    (bar,) = bars
    assert bar.desc == "client_1 eval" and bar.total == len(RECORDS)
    assert bar.n == len(RECORDS)
    assert "client_1 eval" in out.getvalue() and "items/s" in out.getvalue()


def test_scoring_without_a_shared_context_counts_examples_not_pairs(tiny, bars, monkeypatch):
    model, tokenizer = tiny
    on_terminal(monkeypatch)
    contexts = [f"the song number {i} is" for i in range(21)]
    choices = [[" good", " bad", " very very long choice"]] * 21
    # max_length 4 truncates every pair: all go through the per-pair path
    score_choices(model, tokenizer, contexts, choices, max_length=4)
    (bar,) = bars
    assert bar.total == 21 and bar.n == 21
    target_loss(model, tokenizer, contexts, [" good"] * 21)
    assert bars[1].desc == "eval loss" and bars[1].n == 21


def test_no_output_when_stderr_is_not_a_terminal(tiny, bars, monkeypatch):
    model, tokenizer = tiny
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    with progress.participant("server"):
        evaluate_causal_lm(model, tokenizer, RECORDS, "classification", LABELS)
    assert bars[0].disable and out.getvalue() == ""


def test_short_jobs_show_no_bar(tiny, bars, monkeypatch):
    model, tokenizer = tiny
    out = on_terminal(monkeypatch)
    evaluate_causal_lm(model, tokenizer, RECORDS[: progress.MIN_ITEMS - 1], "classification",
                       LABELS)
    assert bars[0].disable and out.getvalue() == ""


def test_knowledge_set_bar_counts_the_public_samples(tiny, bars, monkeypatch):
    model, tokenizer = tiny
    on_terminal(monkeypatch)
    seqs = [{"input_ids": [1 + (i + j) % 50 for j in range(5 + i % 4)],
             "labels": [-100, -100] + [1 + (i + j) % 50 for j in range(2, 5 + i % 4)]}
            for i in range(23)]
    public = PublicSet(seqs, 0)
    with progress.participant("client_0"):
        knowledge_set(LM(model, tokenizer, {}), public, 4, batch_size=5)
    (bar,) = bars
    assert bar.desc == "client_0 knowledge" and bar.total == 23 and bar.n == 23


def test_alignment_bar_counts_the_texts(tmp_path, bars, monkeypatch):
    from tests.alignment.test_sequence import byte_level_bpe

    monkeypatch.setenv("FEDKT_CACHE", str(tmp_path))
    on_terminal(monkeypatch)
    clear_alignment_cache()
    texts = [f"federated text number {i}, aligned across tokenizers" for i in range(25)]
    with progress.participant("server"):
        align_corpus(texts, byte_level_bpe(300), byte_level_bpe(420))
    (bar,) = bars
    assert bar.desc == "server align" and bar.total == 25 and bar.n == 25
    clear_alignment_cache()


def test_loading_a_saved_model_shows_no_library_bar_and_restores_its_settings(
        tmp_path, monkeypatch):
    """transformers' "Loading weights" bar (and its advice) printed before round 0 for every
    model a run loaded; fedkt's own bars stay, and the library's setting is kept after."""
    from transformers.utils import logging as hf_logging

    from fedkt.config import ModelConfig
    from fedkt.models.causal_lm import load_causal_lm

    model, tokenizer = build_tiny_causal_lm("tiny-llama")
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    out = on_terminal(monkeypatch)
    monkeypatch.setenv("COLUMNS", "100")
    assert hf_logging.is_progress_bar_enabled()
    before = hf_logging.get_verbosity()
    with progress.participant("server"):
        load_causal_lm(ModelConfig(name=str(tmp_path / "m"), num_layers=1))
    assert "Loading weights" not in out.getvalue()
    assert out.getvalue().splitlines()[0] == f"server: loading {tmp_path / 'm'}, its first 1 layers"
    assert hf_logging.is_progress_bar_enabled() and hf_logging.get_verbosity() == before
    with progress.quiet_libraries(), progress.quiet_libraries():
        assert not hf_logging.is_progress_bar_enabled()
        with progress.bar(30, "eval") as shown:  # fedkt's own bars still show
            shown.update(30)
    assert "eval" in out.getvalue() and hf_logging.is_progress_bar_enabled()


def test_status_lines_only_on_a_terminal(monkeypatch):
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    progress.status("loading x")
    assert out.getvalue() == ""
    term = on_terminal(monkeypatch)
    with progress.participant("client_1"):
        progress.status("loading x")
    assert term.getvalue() == "client_1: loading x\n"
