"""Score multiple-choice items with an exported model, using only transformers and peft.

``python tests/support/export_reload.py ITEMS.json EXPORT_DIR...`` prints, as JSON, for each
export folder, each item's log-likelihood per choice.  ITEMS.json: ``{"max_length": N, "items": [[context,
[choice, ...]], ...]}``.  An adapter folder (``adapter_config.json``) is loaded as
``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder)``, any
other folder as ``AutoModelForCausalLM.from_pretrained(folder)``.  The tokenisation is
lm-evaluation-harness's (trailing context whitespace moves to the continuation; the
continuation's tokens are those of context + continuation beyond the context's), which
is also fedkt's.  It never imports fedkt (it exits with an error if fedkt got imported),
so ``tests/test_export.py`` can check that an export stands on its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer


def load(folder: Path) -> tuple[torch.nn.Module, object]:
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    adapter = folder / "adapter_config.json"
    if adapter.is_file():
        base = json.loads(adapter.read_text())["base_model_name_or_path"]
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(folder))
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder))
    return model.eval(), tokenizer


def encode(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def special_prefix(tokenizer: object) -> list[int]:
    plain, full = encode(tokenizer, "a"), list(tokenizer.encode("a", add_special_tokens=True))
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    return []


def score(model: torch.nn.Module, tokenizer: object, context: str, choice: str,
          max_length: int) -> float:
    stripped = context.rstrip()
    if stripped != context:
        choice, context = context[len(stripped) :] + choice, stripped
    ctx = encode(tokenizer, context)
    cont = encode(tokenizer, context + choice)[len(ctx) :] or encode(tokenizer, choice)
    ctx = special_prefix(tokenizer) + ctx
    if not ctx:
        ctx = [tokenizer.bos_token_id if tokenizer.bos_token_id is not None
               else tokenizer.eos_token_id]
    seq = (ctx + cont)[-(max_length + 1) :]
    n = min(len(cont), len(seq) - 1)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq[:-1]])).logits[0, -n:]
    logprobs = logits.float().log_softmax(-1)
    return logprobs.gather(-1, torch.tensor(seq[-n:])[:, None]).sum().item()


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    scores = []
    for folder in sys.argv[2:]:
        model, tokenizer = load(Path(folder))
        scores.append([[score(model, tokenizer, ctx, c, spec["max_length"]) for c in choices]
                       for ctx, choices in spec["items"]])
    if any(name == "fedkt" or name.startswith("fedkt.") for name in sys.modules):
        sys.exit("fedkt was imported")
    print(json.dumps(scores))


if __name__ == "__main__":
    main()
