"""The run configs that ship inside the package, found by name from any folder.

``fedkt run demo`` and ``fedkt run fedmkt/hetero`` run the YAML files under
``fedkt/configs/`` (a clone also sees them as ``configs/``); a path to an existing
file runs that file.  ``fedkt configs list`` / ``fedkt configs show NAME`` print them;
``fedkt configs explain KEY`` says what a config key means.
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path

__all__ = [
    "CONFIGS_DIR",
    "DEFAULT_CONFIG",
    "UnknownConfigError",
    "add_config_commands",
    "config_description",
    "packaged_configs",
    "resolve_config",
]

class UnknownConfigError(ValueError):
    """A config argument that is neither an existing file nor a shipped config's name."""


# What `fedkt run` with no argument runs.
DEFAULT_CONFIG = "demo"

CONFIGS_DIR = Path(__file__).resolve().parent

_SUFFIXES = (".yaml", ".yml")
# Prefixes a name may carry when copied from the docs, e.g. `configs/fedkd/quick.yaml`.
_PREFIXES = ("./", "fedkt/configs/", "configs/")


def packaged_configs() -> dict[str, Path]:
    """Shipped configs by name (``demo``, ``fedmkt/hetero``, ...), sorted."""
    found = {p.relative_to(CONFIGS_DIR).with_suffix("").as_posix(): p
             for suffix in _SUFFIXES for p in CONFIGS_DIR.rglob(f"*{suffix}")}
    return dict(sorted(found.items()))


def config_description(path: Path, width: int = 100) -> str:
    """The first sentence of a YAML's leading comment, cut to ``width`` characters."""
    lines: list[str] = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        if not raw.startswith("#"):
            break
        text = raw.lstrip("#").strip()
        # Command examples (indented `fedkt run ...`) end the prose.
        if not text or raw.lstrip("#").startswith(("  ", "\t")):
            break
        lines.append(text)
    # Other configs are named as in `fedkt run NAME`.
    prose = re.sub(r"\bconfigs/([\w/.-]+?)\.ya?ml\b", r"\1", " ".join(lines))
    match = re.search(r"(?<!\bal)\.\s+(?=[A-Z(])", prose)  # "Wu et al. 2022" is not an end
    sentence = (prose[:match.start()] if match else prose).rstrip(".:; ")
    return sentence if len(sentence) <= width else sentence[:width - 1].rstrip() + "…"


def _name_of(text: str) -> str:
    name = text.replace("\\", "/")
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def resolve_config(name_or_path: str | None = None) -> Path:
    """The YAML file to run: an existing path wins, else a shipped config's name.

    ``None`` means :data:`DEFAULT_CONFIG`.  A docs-style path such as
    ``configs/fedkd/quick.yaml`` resolves to the shipped file from any folder.
    Raises :class:`UnknownConfigError` listing close matches otherwise.
    """
    text = DEFAULT_CONFIG if name_or_path is None else name_or_path
    path = Path(text).expanduser()
    if path.is_file():
        return path
    shipped = packaged_configs()
    name = _name_of(text)
    if name in shipped:
        return shipped[name]
    close = difflib.get_close_matches(name, list(shipped), n=5, cutoff=0.5)
    close += [n for n in shipped if name and name in n and n not in close][: 5 - len(close)]
    hint = f"did you mean: {', '.join(close)}? " if close else ""
    raise UnknownConfigError(
        f"config {text!r} is neither a file nor a shipped config; {hint}"
        "`fedkt configs list` shows the shipped ones")


# --------------------------------------------------------------------------- CLI


def cmd_configs_list(args: argparse.Namespace) -> int:
    shipped = packaged_configs()
    width = max(map(len, shipped), default=0)
    for name, path in shipped.items():
        mark = "*" if name == DEFAULT_CONFIG else " "
        print(f"{mark} {name:<{width}}  {config_description(path)}")
    print("\n* the default of `fedkt run`. `fedkt configs show NAME > my.yaml` copies one to edit; "
          "`fedkt run NAME` or `fedkt run my.yaml` runs it.")
    return 0


def cmd_configs_show(args: argparse.Namespace) -> int:
    path = resolve_config(args.name)
    if args.path:
        print(path)
    else:
        print(path.read_text(encoding="utf-8"), end="")
    return 0


def cmd_configs_explain(args: argparse.Namespace) -> int:
    from fedkt.config.explain import explain
    from fedkt.infra.plugins import import_plugins

    import_plugins()  # methods and runtimes a plugin registers (FEDKT_PLUGINS)
    print(explain(args.key, args.method))
    return 0


def add_config_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``fedkt configs list|show|explain`` on the CLI's subparsers."""
    p = sub.add_parser("configs", help="the shipped run configs; what a config key means",
                       description="The run configs that ship with fedkt.")
    p.set_defaults(light=True)  # runs without torch
    csub = p.add_subparsers(dest="configs_command", required=True, metavar="ACTION")
    q = csub.add_parser("list", help="shipped config names and what each runs")
    q.set_defaults(func=cmd_configs_list)
    q = csub.add_parser("show", help="print a shipped config's YAML (to copy and edit)")
    q.add_argument("name", help="config name, e.g. demo or fedmkt/hetero")
    q.add_argument("--path", action="store_true", help="print the file's path instead")
    q.set_defaults(func=cmd_configs_show)
    q = csub.add_parser(
        "explain", help="a config key's type, default, allowed values and description",
        description="What a config key means: its type, default, allowed values (where "
                    "finite) and description; a section (e.g. eval) lists its keys.")
    q.add_argument("key", help="a dotted key or section, e.g. training.lr, eval, method.top_k")
    q.add_argument("--method", metavar="NAME",
                   help="the method whose method.* keys to explain, e.g. fedmkt")
    q.set_defaults(func=cmd_configs_explain)
