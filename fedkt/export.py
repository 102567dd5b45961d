"""``fedkt export``: a run's model in Hugging Face / PEFT format, loadable without fedkt.

:func:`export_model` writes one participant's model after a round:

* a **PEFT adapter folder** (default): ``adapter_config.json``, ``adapter_model.safetensors``
  and the tokenizer, as ``PeftModel.save_pretrained`` writes them, plus the base model
  in ``base_model/`` when the base is not a Hugging Face hub id used unchanged (a
  ``tiny-*`` preset, an offline alias, a GGUF file, a ``num_layers``-pruned model): a
  ``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(OUT / "base_model"),
  OUT)`` away from fedkt's scores;
* with ``merge`` a **merged model**: the LoRA folded into the base weights,
  ``AutoModelForCausalLM.from_pretrained(OUT)``.

LoRA and prefix tuning (FedSP, FedPrompt) export as adapters; prefix tuning cannot be
merged (its virtual tokens are no weights of the base), and is refused with ``merge``.
``peft: full`` and ``none`` export the whole model (it has no adapter).  Encoder and
image classifiers (FedKD, KOALA, the encoder/vision baselines) are refused: their heads
are fedkt's own modules (attentive pooling, ...), which ``transformers`` cannot load.
The export records what it is in ``fedkt_export.json``.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EXPORT_INFO", "ExportError", "ExportResult", "export_model", "parse_participant"]

EXPORT_INFO = "fedkt_export.json"
BASE_DIR = "base_model"


class ExportError(ValueError):
    """A model cannot be exported as asked; the message says why and what to do."""


@dataclass(frozen=True)
class ExportResult:
    """Where an export went and what it holds."""

    path: Path
    participant: str
    round: int
    kind: str  # "adapter" (PEFT folder), "merged" or "full" (a whole HF model)
    base: str | None  # base_model_name_or_path of an adapter export


def parse_participant(name: str) -> tuple[str, int | None]:
    """``server`` / ``global_slm`` / ``client_K`` -> (kind, K or None)."""
    if name in ("server", "global_slm"):
        return name, None
    match = re.fullmatch(r"client_(\d+)", name)
    if match is None:
        raise ExportError(f"--participant {name!r}: expected server, global_slm or client_K "
                          "(e.g. client_0)")
    return "client", int(match.group(1))


def _run_config(run_dir: Path) -> Any:
    from fedkt.config import load_config

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} is not a fedkt run folder (no config.yaml)")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"fedkt\.config")
        return load_config(path, [f"output_dir={json.dumps(str(run_dir))}"])


def _pick_round(run_dir: Path, rnd: int | None) -> int:
    from fedkt.tracking.folder import RunRecorder

    recorder = RunRecorder(run_dir, resume=True, repair=False)
    done = recorder.last_complete_round()
    if rnd is None:
        return done
    kept = [r for r, _ in recorder.round_dirs() if r <= done]
    if rnd != 0 and rnd not in kept:
        raise ExportError(f"--round {rnd}: {run_dir} has no checkpoint of that round (kept: "
                          f"{', '.join(map(str, kept)) or 'none'}; 0 is the initial model)")
    return rnd


def _server(cfg: Any, run_dir: Path, rnd: int) -> Any:
    """The run's server with round ``rnd``'s checkpoint loaded: checked against its recorded
    SHA-256 and refused when it holds NaN or infinity (both errors name the file)."""
    from fedkt.methods import get_method
    from fedkt.tracking.checkpoint import check_finite, read_checkpoint
    from fedkt.tracking.folder import SERVER_STATE, RunRecorder

    recorder = RunRecorder(run_dir, resume=True, repair=False)
    state = None
    if rnd:
        state, _ = read_checkpoint(recorder.checkpoints, rnd, recorder.latest())
        check_finite(state, recorder.checkpoints / f"round_{rnd:04d}" / SERVER_STATE)
    server = get_method(cfg.method.name).server(cfg, run_dir)
    server.setup()
    if state is not None:
        server.load_state_dict(state)
    return server


def _participant_lm(cfg: Any, run_dir: Path, participant: str, rnd: int) -> tuple[Any, Any]:
    """(LM, its ModelConfig) of ``participant`` after round ``rnd``."""
    from fedkt.methods import get_method

    kind, cid = parse_participant(participant)
    method = get_method(cfg.method.name)
    if kind == "client":
        if cid not in cfg.client_ids():
            raise ExportError(f"--participant {participant}: the run's clients are "
                              f"{', '.join(f'client_{c}' for c in cfg.client_ids())}")
        if method.behaviour.client_model is None:
            raise ExportError(
                f"--participant {participant}: method {cfg.method.name!r} keeps no causal LM "
                "per client (FedAvg-style clients end with the global model: export "
                "`--participant server`, FedCoLLM's `global_slm`; encoder and vision methods "
                "have no causal LM)")
        from fedkt.eval.harness import client_model

        lm = client_model(cfg, cid, rnd)
    else:
        lm = _server(cfg, run_dir, rnd).participant_model(participant)
    if lm is None:
        what = ("holds no causal LM (encoder and image classifiers have fedkt's own heads, "
                "which transformers cannot load)" if participant == "server" else
                "has no global_slm (FedCoLLM's co-tuned SLM)")
        raise ExportError(f"--participant {participant}: method {cfg.method.name!r} {what}")
    if lm.source is None:  # pragma: no cover - every LM comes from fedkt.train.lm.get_lm
        raise ExportError(f"--participant {participant}: its model records no model config")
    return lm, lm.source


def _hub_base(model_cfg: Any) -> str | None:
    """The hub id a plain ``from_pretrained`` loads this base from unchanged, else None."""
    from fedkt.models.causal_lm import _local
    from fedkt.models.offline import is_offline_alias
    from fedkt.models.tiny import is_tiny_preset

    if (model_cfg.num_layers is not None or model_cfg.gguf_file or is_tiny_preset(model_cfg.name)
            or is_offline_alias(model_cfg.name)
            or getattr(model_cfg, "quantization", None) is not None):
        return None
    try:
        local = _local(model_cfg.name)
    except Exception:  # noqa: BLE001 - a missing local path: not a hub id either
        return None
    return str(local.resolve()) if local is not None else model_cfg.name


def _fresh_base(model_cfg: Any, seed: int) -> Any:
    """A pristine copy of the base model (the run's seed builds a tiny preset's weights),
    in full precision on the CPU: what an adapter export's ``base_model/`` holds."""
    from fedkt.models.causal_lm import load_causal_lm

    plain = model_cfg.model_copy(update={"quantization": None}) if getattr(
        model_cfg, "quantization", None) is not None else model_cfg
    model, _ = load_causal_lm(plain, seed=seed)
    return model


def _refuse_links(out: Path) -> None:
    """Refuse an export folder holding a symbolic link where the export writes: its
    entries and those of its folders (``.adapter``, ``base_model``), so that nothing is
    written or deleted through a link."""
    from fedkt.tracking.folder import refuse_link

    if not out.is_dir():
        return
    for child in out.iterdir():
        refuse_link(child)
        if child.is_dir():
            for inner in child.iterdir():
                refuse_link(inner)


def export_model(run_dir: str | Path, participant: str, out: str | Path, *,
                 round: int | None = None, merge: bool = False,
                 overwrite: bool = False) -> ExportResult:
    """Export ``participant``'s model of a run after ``round`` (default: the last
    checkpoint; 0: the initial model) to ``out``; see the module docstring."""
    import torch
    from peft import PeftModel

    run_dir, out = Path(run_dir), Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} is not empty; pick an empty folder (or --overwrite)")
    _refuse_links(out)
    cfg = _run_config(run_dir)
    rnd = _pick_round(run_dir, round)
    lm, model_cfg = _participant_lm(cfg, run_dir, participant, rnd)
    model = lm.model
    out.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"run": str(run_dir.resolve()), "participant": participant,
                            "round": rnd, "method": cfg.method.name,
                            "peft": cfg.training.peft, "model": model_cfg.model_dump(mode="json")}
    if not isinstance(model, PeftModel):  # peft: full / none, the whole model trains
        kind, base = "full", None
        model.save_pretrained(str(out), safe_serialization=True)
    else:
        prompt = bool(getattr(model.active_peft_config, "is_prompt_learning", False))
        if merge and prompt:
            raise ExportError(
                f"--merge: {participant}'s adapter is {cfg.training.peft} tuning (virtual "
                "tokens in front of every input), which cannot be folded into the base "
                "weights; export without --merge for a PEFT adapter folder")
        base = _hub_base(model_cfg)
        adapter_dir = out if not merge else out / ".adapter"
        model.save_pretrained(str(adapter_dir), safe_serialization=True)
        fresh = _fresh_base(model_cfg, cfg.seed)
        if merge:
            kind = "merged"
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*adapter.*")
                merged = PeftModel.from_pretrained(fresh, str(adapter_dir)).merge_and_unload()
            merged.save_pretrained(str(out), safe_serialization=True)
            for path in sorted(adapter_dir.iterdir()):
                path.unlink()
            adapter_dir.rmdir()
            base = None
        else:
            kind = "adapter"
            if base is None:
                fresh.save_pretrained(str(out / BASE_DIR), safe_serialization=True)
                lm.tokenizer.save_pretrained(str(out / BASE_DIR))
                base = str((out / BASE_DIR).resolve())
            config_path = out / "adapter_config.json"
            adapter_cfg = json.loads(config_path.read_text())
            adapter_cfg["base_model_name_or_path"] = base
            if model_cfg.revision and base == model_cfg.name:
                adapter_cfg["revision"] = model_cfg.revision
            config_path.write_text(json.dumps(adapter_cfg, indent=2, sort_keys=True) + "\n")
        del fresh
    lm.tokenizer.save_pretrained(str(out))
    info.update(kind=kind, base_model=base, dtype=str(next(model.parameters()).dtype).removeprefix(
        "torch."), torch=torch.__version__)
    (out / EXPORT_INFO).write_text(json.dumps(info, indent=1) + "\n")
    return ExportResult(out, participant, rnd, kind, base)

