"""Special tokens map by role (eos -> eos, bos -> bos, pad -> pad, unk -> unk), never by MinED.

FedMKT Appendix B maps vocabularies by minimum edit distance; applied to special tokens
that taught SmolLM2's EOS position the GPT-2 word ``ĠAmend``.  Every ordered pair of the
tiny presets and the offline tokenizers is checked (real GGUF ones in the slow test).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedkt.alignment import role_ids, special_ids, special_token_mapping, vocab_mapping
from fedkt.alignment.introspect import ROLES
from fedkt.config import ModelConfig

TINY = ["tiny-gpt2", "tiny-opt", "tiny-llama", "tiny-bloom", "tiny-qwen2"]
FAST_REAL = ["gpt2-tokenizer", "llama3-tokenizer"]  # tokenizer.json packages: < 0.5 s a load
GGUF_REAL = ["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"]  # read from GGUF files (cached)
_TOKS: dict[str, object] = {}


def tok(name: str):
    from fedkt.models import load_tokenizer
    from fedkt.models.offline import ModelNotInstalled

    if name not in _TOKS:
        try:
            _TOKS[name] = load_tokenizer(ModelConfig(name=name))
        except ModelNotInstalled as exc:  # names `fedkt models install NAME`
            pytest.skip(str(exc))
    return _TOKS[name]


def check_roles(src, tgt, mapping) -> None:
    """Every source role token lands on the target token of its first role the target has."""
    src_roles, tgt_roles = role_ids(src), role_ids(tgt)
    assert "eos" in src_roles and "eos" in tgt_roles  # every tokenizer here has an EOS
    assert mapping[src_roles["eos"]] == tgt_roles["eos"]
    for role, idx in src_roles.items():
        held = [r for r in ROLES if src_roles.get(r) == idx and r in tgt_roles]
        want = tgt_roles[held[0]] if held else None
        if want is not None:
            assert mapping[idx] == want, (role, idx, mapping[idx])
        if role in tgt_roles and held and held[0] == role:
            assert mapping[idx] == tgt_roles[role]
    tgt_special = special_ids(tgt) | set(tgt_roles.values())
    src_names = src.convert_ids_to_tokens(sorted(mapping))
    for (_idx, tid), text in zip(sorted(mapping.items()), src_names, strict=True):
        # A special source token lands on a target special token or nowhere (-1).
        assert tid == -1 or tid in tgt_special, (text, tid)


@pytest.mark.parametrize(("src", "tgt"), list(itertools.permutations(TINY + FAST_REAL, 2)))
def test_special_tokens_map_by_role(src, tgt):
    s, t = tok(src), tok(tgt)
    mapping = special_token_mapping(s, t)
    check_roles(s, t, mapping)


@pytest.mark.parametrize(("src", "tgt"), list(itertools.permutations(TINY, 2)))
def test_full_mapping_keeps_text_off_special_tokens(src, tgt):
    """Text tokens go through MinED among target text tokens only; specials by role."""
    s, t = tok(src), tok(tgt)
    mapping = vocab_mapping(s, t, cache=False)
    specials = special_token_mapping(s, t)
    for idx, tid in specials.items():
        assert mapping[idx] == tid
    text = np.array([i for i in range(len(mapping)) if i not in specials])
    tgt_special = np.array(sorted(special_ids(t) | set(role_ids(t).values())))
    assert not np.isin(mapping[text], tgt_special).any()
    assert (mapping[text] >= 0).all()


def test_gpt2_endoftext_and_shared_chat_tokens():
    """GPT-2's one special token is its EOS: it lands on the target's EOS; named tokens
    without a role keep their name across tokenizers that share it."""
    gpt2, llama3, qwen = tok("gpt2-tokenizer"), tok("llama3-tokenizer"), tok("tiny-qwen2")
    eot = gpt2.convert_tokens_to_ids("<|endoftext|>")
    assert special_token_mapping(gpt2, llama3)[eot] == llama3.convert_tokens_to_ids(
        "<|end_of_text|>")
    # tiny-qwen2's <|im_start|> has no role: same text in no GPT-2 token -> dropped (-1).
    im_start = qwen.convert_tokens_to_ids("<|im_start|>")
    assert special_token_mapping(qwen, gpt2)[im_start] == -1


@pytest.mark.slow
@pytest.mark.parametrize(("src", "tgt"), [
    p for p in itertools.permutations(GGUF_REAL + FAST_REAL + TINY, 2)
    if p[0] in GGUF_REAL or p[1] in GGUF_REAL])
def test_special_tokens_map_by_role_gguf(src, tgt):
    """The pairs with a GGUF tokenizer (SmolLM2, Qwen2.5, Gemma-3): the first load reads
    the GGUF file (15-20 s for Qwen/Gemma), later ones a cached copy (1-3 s)."""
    s, t = tok(src), tok(tgt)
    check_roles(s, t, special_token_mapping(s, t))


@pytest.mark.slow
def test_smollm2_eos_no_longer_maps_to_a_word():
    """The case that was wrong: SmolLM2's <|im_end|> went to GPT-2's 'ĠAmend' through MinED."""
    smol, gpt2 = tok("smollm2-135m"), tok("gpt2-tokenizer")
    fwd = vocab_mapping(smol, gpt2, cache=False)
    back = vocab_mapping(gpt2, smol, cache=False)
    assert fwd[smol.eos_token_id] == gpt2.eos_token_id  # not 'ĠAmend'
    assert back[gpt2.eos_token_id] == smol.eos_token_id  # <|im_end|>, not <|endoftext|>
    # SmolLM2 -> Qwen2.5: the role wins over the name (SmolLM2's BOS <|im_start|> goes to
    # Qwen's BOS <|endoftext|>); SmolLM2's UNK <|endoftext|> finds no UNK in Qwen and keeps
    # its name; <repo_name> has neither: dropped.
    qwen = tok("qwen2.5-0.5b")
    m = special_token_mapping(smol, qwen)
    ids = smol.convert_tokens_to_ids
    assert m[ids("<|im_start|>")] == qwen.bos_token_id
    assert m[ids("<|endoftext|>")] == qwen.convert_tokens_to_ids("<|endoftext|>")
    assert m[ids("<repo_name>")] == -1
