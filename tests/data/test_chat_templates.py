"""Chat templates (``data.chat_template``) and chat records (``messages``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedkt.config import ConfigError, DatasetConfig, ModelConfig
from fedkt.data import DataError, load_dataset_records
from fedkt.data.formatting import (
    ChatFormat,
    chat_format,
    check_shared_template,
    lm_pair,
    mc_view,
)
from fedkt.models import load_tokenizer
from tests.conftest import needs_models, run_data_of, small_config

# A chat template of one's own: works with any tokenizer, tiny ones included.
JINJA = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>\n"
         "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
INTENT = {"id": "x", "text": "play some jazz", "label": 1}
LABELS = ["get_weather", "play_music"]


@pytest.fixture(scope="module")
def tiny_tok():
    return load_tokenizer(ModelConfig(name="tiny-llama"))


def test_config_takes_auto_none_or_a_jinja_template_that_compiles(tmp_path):
    assert small_config(tmp_path).data.chat_template == "none"
    assert small_config(tmp_path, "data.chat_template=auto").data.chat_template == "auto"
    with pytest.raises(ConfigError, match="data.chat_template: expected auto, none or a Jinja"):
        small_config(tmp_path, "data.chat_template=chatml")
    with pytest.raises(ConfigError, match="data.chat_template: the Jinja template does not "
                                          "compile"):
        small_config(tmp_path, "data.chat_template='{% for m in messages %}'")


def test_a_jinja_template_wraps_the_prompt_as_a_user_turn(tiny_tok):
    chat = chat_format(JINJA, tiny_tok)
    prompt, target = lm_pair(INTENT, "classification", LABELS, chat=chat)
    assert prompt == "<user>Text: play some jazz\nLabel:</user>\n<assistant>"
    assert target == "play_music"  # the assistant's reply: no leading space
    context, choices, gold = mc_view(INTENT, "classification", LABELS, chat=chat)
    assert (context, choices, gold) == (prompt, LABELS, 1)
    # none, and auto for a tokenizer without a template: plain prompts, as before
    assert chat_format("none", tiny_tok) is None and chat_format("auto", tiny_tok) is None
    assert lm_pair(INTENT, "classification", LABELS) == ("Text: play some jazz\nLabel:",
                                                         " play_music")


@needs_models("smollm2-135m")
def test_auto_uses_the_instruct_models_own_template():
    tok = load_tokenizer(ModelConfig(name="smollm2-135m"))
    chat = chat_format("auto", tok)
    assert isinstance(chat, ChatFormat)
    prompt, target = lm_pair(INTENT, "classification", LABELS, chat=chat)
    assert prompt == tok.apply_chat_template(
        [{"role": "user", "content": "Text: play some jazz\nLabel:"}], tokenize=False,
        add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nText: play some jazz\nLabel:<|im_end|>\n"
                           "<|im_start|>assistant\n") and target == "play_music"


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_records_with_messages_are_a_prompt(tmp_path, tiny_tok):
    rows = [{"messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Summarise: the cat sat."},
                          {"role": "assistant", "content": "A cat sat."}]},
            {"messages": [{"role": "user", "content": "Say hi"}], "target": "hi"}]
    ds = load_dataset_records(DatasetConfig(path=str(_write(tmp_path / "c.jsonl", rows)),
                                            task="generation"))
    first, second = ds.records
    assert first["prompt"] == "Summarise: the cat sat." and first["target"] == "A cat sat."
    assert first["messages"] == [{"role": "system", "content": "Be brief."}]
    assert "messages" not in second and second["target"] == "hi"
    # without a chat template the earlier turns are lines before the task's prompt
    assert lm_pair(first, "generation") == (
        "System: Be brief.\nInput:\nSummarise: the cat sat.\nOutput:", " A cat sat.")
    # with one, they are turns of the chat
    prompt, target = lm_pair(first, "generation", chat=chat_format(JINJA, tiny_tok))
    assert prompt == ("<system>Be brief.</system>\n<user>Input:\nSummarise: the cat sat.\n"
                      "Output:</user>\n<assistant>") and target == "A cat sat."
    clf = load_dataset_records(DatasetConfig(
        path=str(_write(tmp_path / "k.jsonl", [{"messages": [{"role": "user", "content": "hi"}],
                                                "label": 0}])),
        task="classification", label_names=["greeting"]))
    assert clf.records[0]["text"] == "hi"


def test_bad_messages_name_the_record_and_field(tmp_path):
    def load(rows: list[dict], task: str = "generation") -> None:
        load_dataset_records(DatasetConfig(path=str(_write(tmp_path / "b.jsonl", rows)),
                                           task=task, label_names=["a"]))

    with pytest.raises(DataError, match=r"b.jsonl record 1 \(line 1\): field .messages.: the last turn must be "
                                        r"the user's"):
        load([{"messages": [{"role": "user", "content": "q"},
                            {"role": "assistant", "content": "a"}], "label": 0}],
             "classification")
    with pytest.raises(DataError, match=r"record 1 \(line 1\): field .messages. turn 0: expected "
                                        r"\{role, content\}"):
        load([{"messages": [{"role": "robot", "content": "q"}], "target": "t"}])
    with pytest.raises(DataError, match="turn 0.*is empty"):
        load([{"messages": [{"role": "user", "content": " "}], "target": "t"}])


def test_evaluation_and_training_use_the_template(tmp_path):
    from fedkt.eval import predictions
    from fedkt.eval.scorer import score_choices
    from fedkt.train.lm import client_lm, evaluate_lm, lm_batches

    cfg = small_config(tmp_path, f"data.chat_template={json.dumps(JINJA)}")
    lm = client_lm(cfg, 0)
    fd_records = [dict(r, id=str(i)) for i, r in enumerate(
        [{"text": "play jazz", "label": 3}, {"text": "weather in Paris", "label": 2}])]
    with predictions.capture() as tables:
        evaluate_lm(cfg, lm, fd_records, data=run_data_of(cfg))
    from fedkt.data.splits import run_data

    names = run_data(cfg.data, 2, 0).label_names
    chat = chat_format(JINJA, lm.tokenizer)
    contexts = [mc_view(r, "classification", names, chat=chat)[0] for r in fd_records]
    want = score_choices(lm.model, lm.tokenizer, contexts, [names] * 2)
    plain = score_choices(lm.model, lm.tokenizer,
                          [mc_view(r, "classification", names)[0] for r in fd_records],
                          [[" " + n for n in names]] * 2)
    got = tables[""].columns["scores"]
    for g, w, p in zip(got, want, plain, strict=True):  # (evaluation runs under autocast)
        assert g == pytest.approx(w, abs=0.02) and g != pytest.approx(p, abs=0.5)
    (batch,) = lm_batches(cfg, lm.tokenizer, fd_records[:1], seed=None, data=run_data_of(cfg))
    text = lm.tokenizer.decode(batch["input_ids"][0])
    assert "<user>Text: play jazz\nLabel:</user>\n<assistant>" in text
    scored = batch["labels"][0][batch["labels"][0] != -100]
    assert lm.tokenizer.decode(scored).startswith(names[3])  # the reply (and EOS) only


def test_fedmkt_refuses_templates_that_differ_between_models(tiny_tok):
    gpt2 = load_tokenizer(ModelConfig(name="tiny-gpt2"))
    check_shared_template("none", {"server": tiny_tok, "client 0": gpt2}, "fedmkt")
    check_shared_template(JINJA, {"server": tiny_tok, "client 0": gpt2}, "fedmkt")
    check_shared_template("auto", {"server": tiny_tok, "client 0": gpt2}, "fedmkt")  # both plain


@needs_models("smollm2-135m")
def test_auto_across_families_is_refused_naming_the_models(tiny_tok):
    smol = load_tokenizer(ModelConfig(name="smollm2-135m"))
    with pytest.raises(ConfigError, match=r"data.chat_template: fedmkt aligns .* \(server: "
                                          r"'<\|im_start\|>system.*client 0: plain\)"):
        check_shared_template("auto", {"server": smol, "client 0": tiny_tok}, "fedmkt")
