"""Fuzzing bad input: configs, ``--set`` overrides, the CLI, dataset files and payloads.

Every property says the same thing: garbage in gives either a valid result or the
module's own validation error (``ConfigError``, ``DataError``, ``PayloadError``) whose
message names the key, file or field at fault -- never another exception, never a
traceback from the CLI, never a training run started from a bad config.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fedkt.cli import main
from fedkt.config import ConfigError, apply_overrides, load_config, parse_config
from fedkt.data import DataError, clear_cache, load_dataset_records
from fedkt.data.records import DatasetConfig
from fedkt.federated.payload import MAGIC, Payload, PayloadError, dumps, loads
from fedkt.methods import available

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted((ROOT / "configs").rglob("*.yaml"))


def _parses(path: Path) -> bool:
    try:
        load_config(path)
    except Exception:  # noqa: BLE001 - a config that does not load is no base to mutate
        return False
    return True


# Mutations start from the shipped configs that are valid as they are, so that every
# error comes from a mutation (test_config.py checks that all of them load).
CONFIG_FILES = [p for p in CONFIG_FILES if _parses(p)]
CONFIGS = {p: yaml.safe_load(p.read_text()) for p in CONFIG_FILES}



def fuzz(max_examples: int) -> settings:
    """Deterministic (derandomized), no deadline: CI machines are slow and shared."""
    return settings(deadline=None, derandomize=True, database=None, max_examples=max_examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much,
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --------------------------------------------------------------------------- values

_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63), 10**400]),
    st.builds(pow, st.just(10), st.just(5000)),  # too long for repr() (Python's 4300 digits)
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", " ", "{", "{name}", "{0}", "{x}", "nan", "-inf", "1e999", "~",
                     "fedavg", "lora", "holdout", "iid", "tiny-llama", "x" * 300]),
)
values = st.recursive(
    _atoms,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every dotted path (as a tuple) into a nested dict/list config."""
    out = []
    items = (node.items() if isinstance(node, dict)
             else enumerate(node) if isinstance(node, list) else ())
    for k, v in items:
        out.append((*prefix, k))
        out += _paths(v, (*prefix, k))
    return out


def _parent(data: Any, path: tuple) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def _error_keys(msg: str) -> list[str]:
    """The dotted keys listed in a formatted config error (``  key: problem`` lines)."""
    return [m.group(1) for m in re.finditer(r"^  (\S+?): ", msg, flags=re.M)]


def _same_section(key: str, path: tuple) -> bool:
    return key.split(".")[0] == (str(path[0]) or "''")


@st.composite
def mutated_configs(draw) -> tuple[Any, list[tuple]]:
    """A real config from configs/ with 1-3 random mutations; returns (data, mutated paths)."""
    data = copy.deepcopy(CONFIGS[draw(st.sampled_from(CONFIG_FILES))])
    touched: list[tuple] = []
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        op = draw(st.sampled_from(["delete", "replace", "replace", "unknown", "method"]))
        if op == "method":
            name = draw(st.one_of(st.sampled_from(available()), values))
            if isinstance(data.get("method"), dict) and draw(st.booleans()):
                data["method"]["name"] = name
                touched.append(("method", "name"))
            else:
                data["method"] = name
                touched.append(("method",))
            continue
        if op == "unknown" or not paths:
            dicts = [()] + [p for p in paths if isinstance(_parent(data, (*p, 0)), dict)]
            where = draw(st.sampled_from(dicts))
            key = draw(st.sampled_from(["__fuzz__", "lr", "nme", "Rounds", ""]))
            node = _parent(data, (*where, 0))
            if key in node:
                continue
            node[key] = draw(values)
            touched.append((*where, key))
            continue
        path = draw(st.sampled_from(paths))
        parent = _parent(data, path)
        if op == "delete":
            if isinstance(parent, list):
                parent.pop(path[-1])
            else:
                del parent[path[-1]]
        else:
            parent[path[-1]] = draw(values)
        touched.append(path)
        if not touched[-1]:
            touched.pop()
    return data, touched


def _check_config_error(exc: ConfigError, touched: list[tuple]) -> None:
    msg = str(exc)
    assert msg.strip(), "empty error message"
    keys = _error_keys(msg)
    if keys:
        assert all(k != "<top>" for k in keys), msg
        # A new method may refuse other sections (cross-field checks); else the mutated
        # section is at fault.
        assert any(_same_section(k, p) or p[0] == "method" for k in keys for p in touched), (
            msg, touched)
    else:  # a one-line error: it must name one of the mutated sections
        assert any(str(p[0]) in msg for p in touched), (msg, touched)


# --------------------------------------------------------------------------- configs


@fuzz(200)
@given(mutated_configs())
def test_mutated_configs_parse_or_name_the_key(case) -> None:
    data, touched = case
    try:
        parse_config(data, "fuzz.yaml")
    except ConfigError as exc:
        assert "fuzz.yaml" in str(exc) or "method.name" in str(exc)
        _check_config_error(exc, touched)


def _yaml_value(value: Any) -> str:
    try:
        return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()
    except (yaml.YAMLError, ValueError):
        return "null"


override_keys = st.one_of(
    st.sampled_from(sorted({".".join(map(str, p)) for d in CONFIGS.values() for p in _paths(d)})),
    st.sampled_from(["", ".", "a..b", "rounds.x", "clients.models.9.name",
                     "clients.models.x.name", "clients.models.-1.name", "method.name.x",
                     "data.dataset.fields.0", "__fuzz__.deep.key", " training . lr "]),
    st.text(max_size=15),
)
override_values = st.one_of(values.map(_yaml_value), st.text(max_size=20),
                            st.sampled_from(["[", "{a: ", "- - -", ": :", "!!python/object:os.system",
                                             "*alias", "&a [*a]", "1" * 5000, "'unterminated"]))


@fuzz(200)
@given(st.sampled_from(CONFIG_FILES), st.lists(st.tuples(override_keys, override_values),
                                               min_size=1, max_size=3),
       st.booleans())
def test_overrides_apply_or_name_the_key(path: Path, sets, drop_equals: bool) -> None:
    items = [f"{k}={v}" for k, v in sets]
    if drop_equals:
        items[0] = items[0].replace("=", "")
    try:
        parse_config(apply_overrides(CONFIGS[path], items), str(path))
    except ConfigError as exc:
        msg = str(exc)
        keys = _error_keys(msg)
        set_keys = [item.split("=", 1)[0] for item in items]
        touched = [tuple(p.strip() for p in k.split(".")) for k in set_keys]
        if keys:
            assert all(k != "<top>" for k in keys), msg
        named = [k for k, p in zip(set_keys, touched, strict=True)
                 if k.strip() and (k.strip() in msg or k in msg or ".".join(p) in msg
                                   or repr(k.strip())[1:-1] in msg)]
        assert named or any(_same_section(k, p) for k in keys for p in touched) or (
            "KEY=VALUE" in msg), (msg, items)


yaml_texts = st.one_of(
    st.text(max_size=200),
    st.sampled_from(["", "---", "[1, 2", "{a: 1", "- a\n- b", "42", "null", "'x'",
                     "method: fedavg", "method: {name: [1]}\ndata: 3", "a: &x [*x]",
                     "rounds: " + "9" * 5000, "!!binary AAAA", "!!python/name:os.system",
                     "\t- tab", "key: value\n  bad indent: 1", "\ufeffmethod: fedavg",
                     "method: fedavg\noutput_dir: '{0}'", "method: fedavg\noutput_dir: '{oops}'",
                     "method: fedavg\noutput_dir: '{'"]),
    values.map(lambda v: _yaml_value(v)),
)


@fuzz(150)
@given(st.one_of(yaml_texts.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=200),
                 st.builds(lambda b, t: t.encode() + b, st.binary(min_size=1, max_size=8),
                           st.sampled_from(["method: fedavg\n", "name: x\n"]))))
def test_load_config_on_random_files(scratch: Path, raw: bytes) -> None:
    path = scratch / "random.yaml"
    path.write_bytes(raw)
    try:
        load_config(path)
    except ConfigError as exc:
        assert str(path) in str(exc), str(exc)


def test_huge_and_non_finite_values_name_the_key() -> None:
    data = copy.deepcopy(CONFIGS[ROOT / "configs" / "quickstart.yaml"])
    for key, value in [("training.lr", ".inf"), ("training.lr", ".nan"),
                       ("training.betas", "[.nan, 0.9]"), ("rounds", "9" * 5000),
                       ("output_dir", "'runs/{nme}'"), ("clients.models.7.name", "x"),
                       ("clients.models.x.name", "x"), ("=3", None), ("a..b", "1")]:
        item = key if value is None else f"{key}={value}"
        with pytest.raises(ConfigError) as info:
            parse_config(apply_overrides(data, [item]), "quickstart.yaml")
        assert key.strip("=") in str(info.value) or "KEY=VALUE" in str(info.value), str(info.value)
    data["training"]["batch_size"] = -(10**5000)  # not from YAML: an int too big to print
    with pytest.raises(ConfigError, match="training.batch_size"):
        parse_config(data, "quickstart.yaml")
    data["training"]["batch_size"] = 8
    data["method"] = ["fedavg"]
    with pytest.raises(ConfigError, match="method"):
        parse_config(data, "quickstart.yaml")
    data["method"] = {"name": {"x": 1}}
    with pytest.raises(ConfigError, match="method.name"):
        parse_config(data, "quickstart.yaml")


# --------------------------------------------------------------------------- the CLI


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse usage errors
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def _assert_usage_error(rc: int, out: str, err: str, run_dir: Path) -> None:
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    first = err.splitlines()[0] if err else ""
    assert first.startswith("fedkt: error: ") and len(first) > len("fedkt: error: "), err
    assert "rounds ->" not in out  # the banner cmd_run prints before training
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "metrics.jsonl").exists()


@fuzz(80)
@given(st.one_of(mutated_configs().map(lambda c: _yaml_value(c[0])), yaml_texts),
       st.lists(st.tuples(override_keys, override_values).map("=".join), max_size=2))
def test_cli_run_and_eval_on_garbage_configs(scratch: Path, text: str, sets: list[str]) -> None:
    run_dir = scratch / "cli_run"
    path = scratch / "garbage.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    set_args = [f"--set={s}" for s in sets]  # --set=VALUE: a value may start with "-"
    set_args += ["--set", f"output_dir={json.dumps(str(run_dir))}"]
    try:
        load_config(path, [*sets, f"output_dir={json.dumps(str(run_dir))}"])
    except ConfigError:
        pass
    else:
        assume(False)  # a valid config would (rightly) start training
    _assert_usage_error(*_cli(["run", str(path), *set_args]), run_dir)

    eval_dir = scratch / "cli_eval"
    eval_dir.mkdir(exist_ok=True)
    (eval_dir / "config.yaml").write_text(text, encoding="utf-8", errors="surrogateescape")
    rc, out, err = _cli(["eval", str(eval_dir), *[f"--set={s}" for s in sets]])
    _assert_usage_error(rc, out, err, eval_dir)


def test_cli_bad_flags_are_usage_errors(scratch: Path) -> None:
    path = scratch / "quickstart.yaml"
    path.write_text((ROOT / "configs" / "quickstart.yaml").read_text())
    run_dir = scratch / "flags_run"
    for extra in (["--rounds", "0"], ["--seed", "1", "--set", "training.lr=-1"],
                  ["--set", "nokey"], ["--set", "clients.models.5.name=x"],
                  ["--output-dir", str(run_dir / "{x}")]):
        rc, out, err = _cli(["run", str(path), "--output-dir", str(run_dir), *extra])
        _assert_usage_error(rc, out, err, run_dir)
    rc, out, err = _cli(["run", str(path), "--rounds", "many"])
    assert rc == 2 and "Traceback" not in err and "--rounds" in err


# --------------------------------------------------------------------------- dataset files

TASK_SHAPES = {
    "classification": ("text", "label"),
    "multiple_choice": ("prompt", "choices", "label"),
    "generation": ("prompt", "target", "references"),
}
record_values = st.one_of(
    values,
    st.sampled_from(["ok text", "  ", "0", "1", "-1", "7", "1.0", "--1", "²", "٣", "1e999",
                     "9" * 5000, '["a", "b"]', "[1, 2", "[]", "a,b", "not-hate"]),
    st.lists(st.sampled_from(["a", "b", " ", ""]), max_size=4),
)


GOOD = {
    "text": st.sampled_from(["good text", " padded ", "caf\u00e9 \u2028 ok", "a,b \"q\""]),
    "prompt": st.sampled_from(["a question?", "another one"]),
    "target": st.sampled_from(["an answer", "b"]),
    "references": st.lists(st.sampled_from(["r1", "r2"]), min_size=1, max_size=2),
    "choices": st.lists(st.sampled_from(["yes", "no", "maybe"]), min_size=1, max_size=3),
    "label": st.one_of(st.integers(0, 3), st.sampled_from(["0", "1", " 2 ", "neg", "pos",
                                                           "yes", "no", 1.0])),
}


def _printable(value: Any) -> bool:
    try:
        json.dumps(value)
    except ValueError:
        return False
    return True


def _str(value: Any) -> str:
    try:
        return str(value)
    except ValueError:  # an int too long to print
        return "9" * 5000


@st.composite
def dataset_files(draw) -> tuple[str, bytes, dict[str, Any]]:
    task = draw(st.sampled_from(sorted(TASK_SHAPES)))
    names = list(TASK_SHAPES[task])
    mapping = draw(st.dictionaries(st.sampled_from(names),
                                   st.sampled_from(["col_a", "col_b", "label", "text"]),
                                   max_size=2))
    if "choices" in names and draw(st.booleans()):
        mapping["choices"] = "a,b"  # several columns joined into one list field
    if draw(st.sampled_from([False] * 9 + [True])):
        mapping["bogus"] = "col_a"  # not a fedkt field of any task
    rows = []
    for _ in range(draw(st.integers(1, 5))):  # mostly valid rows, a few bad values
        row: dict[str, Any] = {}
        for name in names:
            for src in mapping.get(name, name).split(","):
                how = draw(st.sampled_from("vvvvvvrrm"))
                if how == "v":
                    row[src] = draw(GOOD[name] if "," not in mapping.get(name, name)
                                    else GOOD["target"])
                elif how == "r":
                    row[src] = draw(record_values)
        if draw(st.booleans()):
            row[draw(st.sampled_from(["extra", "col_b", ""]))] = draw(record_values)
        rows.append(row)
    fmt = draw(st.sampled_from(["jsonl", "csv"]))
    if fmt == "jsonl":
        lines = []
        for row in rows:
            try:
                lines.append(json.dumps(row))
            except ValueError:  # an int too long to print
                lines.append('{"label": ' + "9" * 5000 + "}")
        lines += draw(st.lists(st.sampled_from(["", "   ", "[1]", "null", "{bad", '"s"',
                                                '{"label": NaN}', '{"label": 1e400}']),
                               max_size=2))
        raw = "\n".join(draw(st.permutations(lines))).encode()
    else:
        cols = list(dict.fromkeys(k for r in rows for k in r))
        buf = io.StringIO()
        writer = csv.writer(buf)
        if cols or draw(st.booleans()):
            writer.writerow(cols)
        for row in rows:
            writer.writerow([json.dumps(v) if isinstance(v, list | dict) and _printable(v)
                             else _str(row.get(c, "")) for c in cols for v in [row.get(c, "")]])
        if draw(st.booleans()):
            buf.write("a,b,c,d,e,f,g\n")  # too many values
        raw = buf.getvalue().encode("utf-8", "surrogatepass")
    corruption = draw(st.sampled_from(["none"] * 6 + ["bom", "latin1", "nul", "truncate",
                                       "empty", "bytes"]))
    if corruption == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif corruption == "latin1":
        raw = raw + b'\n{"text": "caf\xe9", "label": 0}\n'
    elif corruption == "nul":
        raw = raw.replace(b",", b"\x00,", 1) + b"\x00"
    elif corruption == "truncate":
        raw = raw[: draw(st.integers(0, max(len(raw), 0)))]
    elif corruption == "empty":
        raw = b""
    elif corruption == "bytes":
        raw = draw(st.binary(max_size=80))
    label_names = draw(st.one_of(st.none(), st.lists(st.sampled_from(["neg", "pos", "x"]),
                                                     max_size=3)))
    template = draw(st.one_of(st.none(), st.sampled_from(
        ["{text}", "{prompt} {labels}", "{nope}", "{0}", "{", "{text.upper}", "{label[0]}",
         "{text:>99999999999999999999}", "{text!z}", "{extra}", "{col_a}"])))
    cfg = {"task": task, "fields": mapping, "label_names": label_names, "template": template}
    return fmt, raw, cfg


def _check_records(ds) -> None:
    assert ds.records
    for r in ds.records:
        if ds.task in ("classification", "multiple_choice"):
            assert isinstance(r["label"], int) and r["label"] >= 0
        if ds.task == "classification":
            assert isinstance(r["text"], str) and r["text"].strip()
            assert ds.label_names is not None and r["label"] < len(ds.label_names)
        elif ds.task == "multiple_choice":
            assert all(isinstance(c, str) and c for c in r["choices"])
            assert r["label"] < len(r["choices"])
        else:
            assert isinstance(r["prompt"], str) and isinstance(r["target"], str)


@fuzz(300)
@given(dataset_files())
def test_dataset_files_load_or_name_the_file(scratch: Path, case) -> None:
    fmt, raw, cfg = case
    path = scratch / f"records.{fmt}"
    path.write_bytes(raw)
    clear_cache()
    try:
        dcfg = DatasetConfig(path=str(path), **cfg)
    except ValueError:
        return  # the config itself was refused (pydantic), before any file is read
    try:
        ds = load_dataset_records(dcfg)
    except DataError as exc:
        msg = str(exc)
        assert str(path) in msg or msg.startswith(("fields:", "label_names")), msg
    else:
        _check_records(ds)


def test_dataset_bad_bytes_and_huge_labels_name_the_file(scratch: Path) -> None:
    cases = {
        "latin1.jsonl": b'{"text": "ok", "label": 0}\n{"text": "caf\xe9", "label": 1}\n',
        "latin1.csv": b"text,label\nok,0\ncaf\xe9,1\n",
        "bigint.jsonl": b'{"text": "ok", "label": ' + b"9" * 5000 + b"}\n",
        "bigstr.csv": b"text,label\nok," + b"9" * 5000 + b"\n",
        "huge.jsonl": b'{"text": "ok", "label": 1000000000000}\n',
        "super.csv": "text,label\nok,\u00b2\n".encode(),
        "dashes.csv": b"text,label\nok,--1\n",
        "empty.jsonl": b"",
        "blank.jsonl": b"\n  \n",
    }
    for name, raw in cases.items():
        path = scratch / name
        path.write_bytes(raw)
        clear_cache()
        with pytest.raises(DataError) as info:
            load_dataset_records(DatasetConfig(path=str(path), task="classification"))
        assert str(path) in str(info.value), str(info.value)
        if name.startswith("latin1"):  # the bad byte is on the second record's line
            line = "line 2" if name.endswith(".jsonl") else "line 3"
            assert line in str(info.value), str(info.value)
    path = scratch / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "ok", "label": 1}\n')
    clear_cache()
    assert load_dataset_records(DatasetConfig(path=str(path), task="classification")
                                ).records[0]["label"] == 1
    path = scratch / "tpl.jsonl"
    path.write_bytes(b'{"text": "ok", "label": 1}\n')
    for template in ("{text.nope}", "{label[0]}"):
        clear_cache()
        # Refused as the config is built (a ValueError naming 'template'), before any file.
        with pytest.raises(ValueError, match="template"):
            load_dataset_records(DatasetConfig(path=str(path), task="classification",
                                               template=template))


# --------------------------------------------------------------------------- payloads

_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.uint8, torch.bool, torch.float64, torch.int8]


@st.composite
def tensors(draw) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 3), max_size=3))
    dtype = draw(st.sampled_from(_DTYPES))
    fill = draw(st.sampled_from([0.0, 1.0, -5.0, math.nan, math.inf, 300.0]))
    t = torch.full(shape, fill) if not (math.isnan(fill) or math.isinf(fill)) or (
        dtype.is_floating_point) else torch.zeros(shape)
    return t.to(dtype)


payload_values = st.one_of(values, tensors(),
                           st.dictionaries(st.sampled_from(["a", "b.w", "c"]), tensors(),
                                           min_size=1, max_size=3))
payloads = st.dictionaries(st.sampled_from(["t", "adapter", "n", "logits", "meta"]),
                           payload_values, max_size=4)


def _valid_bytes(payload: dict) -> bytes | None:
    try:
        return dumps(payload)
    except PayloadError:
        return None


@st.composite
def corrupted_payloads(draw) -> bytes:
    data = _valid_bytes(draw(payloads)) or dumps({"t": torch.ones(2), "n": 1})
    (n,) = struct.unpack("<Q", data[4:12])
    header = json.loads(data[12:12 + n])
    how = draw(st.sampled_from(["truncate", "flip", "header", "length", "st_header", "random",
                                "append"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data)))]
    if how == "flip":
        buf = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] = draw(st.integers(0, 255))
        return bytes(buf)
    if how == "header":
        header = draw(st.one_of(values, st.fixed_dictionaries(
            {"meta": values, "kinds": st.one_of(values, st.dictionaries(
                st.sampled_from(["t", "adapter", "n", "zz"]),
                st.one_of(st.sampled_from(["tensor", "state", "blob"]), values), max_size=3))})))
        try:
            body = json.dumps(header).encode()
        except ValueError:
            body = b"{" * 5
        return MAGIC + struct.pack("<Q", len(body)) + body + data[12 + n:]
    if how == "length":
        return MAGIC + struct.pack("<Q", draw(st.sampled_from([0, 1, n - 1, n + 1, 2**63, 2**64 - 1]))
                                   ) + data[12:]
    if how == "st_header":  # wrong dtype / shape / offsets inside the safetensors header
        blob = data[12 + n:]
        if len(blob) < 8:
            return data + b"\x00" * draw(st.integers(1, 9))
        (m,) = struct.unpack("<Q", blob[:8])
        st_head = json.loads(blob[8:8 + m])
        for entry in st_head.values():
            if isinstance(entry, dict) and "dtype" in entry:
                which = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
                entry[which] = draw(st.one_of(
                    st.sampled_from(["F32", "I64", "BOOL", "F8_E4M3", "XX"]),
                    st.lists(st.integers(-2, 2**40), max_size=3), values))
        try:
            body = json.dumps(st_head, default=str).encode()
        except ValueError:  # an int too long to print
            body = b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}'
        return data[:12 + n] + struct.pack("<Q", len(body)) + body + blob[8 + m:]
    if how == "append":
        return data + draw(st.binary(min_size=1, max_size=16))
    return MAGIC + draw(st.binary(max_size=64))


@fuzz(300)
@given(st.one_of(st.binary(max_size=64), corrupted_payloads()))
def test_payload_loads_raises_only_payload_error(raw: bytes) -> None:
    try:
        out = loads(raw, source="client 7")
    except PayloadError as exc:
        assert "client 7" in str(exc)
    else:
        assert isinstance(out, Payload)
        for key, value in out.items():
            assert isinstance(key, str)
            if isinstance(value, dict):
                assert all(isinstance(k, str) for k in value)


@fuzz(200)
@given(payloads, st.sampled_from(["t", "adapter", "n", "missing"]),
       st.one_of(st.none(), st.lists(st.one_of(st.none(), st.integers(-1, 4)), max_size=3)),
       st.one_of(st.none(), st.sampled_from(_DTYPES), st.lists(st.sampled_from(_DTYPES),
                                                                 max_size=2)),
       st.one_of(st.none(), st.floats(allow_nan=True), st.integers(-(2**70), 2**70)),
       st.one_of(st.none(), st.dictionaries(st.sampled_from(["a", "b.w", "z"]), tensors(),
                                            max_size=3)),
       st.booleans())
def test_payload_validators_raise_only_payload_error(p, key, shape, dtype, bound, like,
                                                     finite) -> None:
    payload = Payload(p)
    for check in (
        lambda: payload.tensor(key, source="client 5", shape=shape, dtype=dtype, finite=finite,
                               low=bound, high=bound),
        lambda: payload.state(key, source="client 5", like=like, finite=finite),
        lambda: payload.number(key, source="client 5", low=bound),
    ):
        try:
            check()
        except PayloadError as exc:
            assert "client 5" in str(exc) and repr(key) in str(exc), str(exc)
    # The validators see the same data after a trip over the wire.
    data = _valid_bytes(p)
    if data is not None:
        back = loads(data)
        assert set(back) == set(p)


def test_payload_number_huge_int_and_bad_header_kinds() -> None:
    with pytest.raises(PayloadError, match="'n'"):
        Payload(n=10**400).number("n", source="client 1")
    body = json.dumps({"meta": {}, "kinds": {"t": "tensor"}}).encode()
    with pytest.raises(PayloadError, match="'t'"):
        loads(MAGIC + struct.pack("<Q", len(body)) + body, source="client 1")
    body = json.dumps([1, 2]).encode()
    with pytest.raises(PayloadError, match="client 1"):
        loads(MAGIC + struct.pack("<Q", len(body)) + body, source="client 1")
