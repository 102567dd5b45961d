"""Templates are bounded: plain field names, widths and precisions within a limit.

The templates that got through before: ``{text:>20000000}`` ran for minutes and took
10 GB, ``{text:>300000000}`` aborted the process, ``{text.__class__.__mro__}`` was
accepted.  Each is now refused when the config is parsed (the key named) and, for a
template that reaches a client inside the server's config, again when a prompt is
formatted.
"""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedkt.config import ConfigError, parse_config
from fedkt.data import DataError, format_prompt
from fedkt.infra.templates import HARD_MAX_WIDTH, check_template
from tests.conftest import small_config

RECORD = {"id": "r1", "text": "hello", "label": 0, "extra": {"lang": "en"}}

HOSTILE = {
    "{text:>20000000}": r"width 20000000 is above the limit",
    "{text:>300000000}": r"width 300000000 is above the limit",
    "{text:.900000000}": r"precision 900000000 is above the limit",
    "{text:>99999999999999999999}": r"width 9999999999.* is above the limit",
    "{text.__class__.__mro__}": r"only plain field names",
    "{label[0]}": r"only plain field names",
    "{0}": r"only plain field names",
    "{}": r"only plain field names",
    "{text!a}": r"the conversion must be !s or !r",
    "{text:{label}}": r"no nested fields",
    "{text": r"malformed",
}


def config_with(tmp_path, template: str, *extra: str):
    cfg = small_config(tmp_path / "run", *extra).model_dump(mode="json")
    cfg["data"]["dataset"]["template"] = template
    return parse_config(cfg, "test config")


@pytest.mark.parametrize("template", sorted(HOSTILE))
def test_hostile_templates_are_refused_at_parse_time_naming_the_key(tmp_path, template):
    with pytest.raises(ConfigError, match=r"data\.dataset\.template") as info:
        config_with(tmp_path, template)
    assert re.search(HOSTILE[template], str(info.value)), str(info.value)


@pytest.mark.parametrize("template", sorted(HOSTILE))
def test_a_client_refuses_them_too_and_at_once(template):
    """A template from a server's config reaches format_prompt unchecked by the client's
    own config file: it is checked there, in well under a second."""
    start = time.perf_counter()
    with pytest.raises(DataError):
        format_prompt(RECORD, "classification", ["neg", "pos"], template)
    assert time.perf_counter() - start < 0.5


def test_template_max_width_is_a_config_key(tmp_path):
    assert config_with(tmp_path, "Text: {text:>80}\nLabel:").data.template_max_width == 1000
    with pytest.raises(ConfigError, match=r"data.*template.*width 80 is above the limit 50 "
                                          r"\(data.template_max_width\)"):
        config_with(tmp_path, "Text: {text:>80}\nLabel:", "data.template_max_width=50")
    with pytest.raises(ConfigError, match="template_max_width"):
        config_with(tmp_path, "{text}", f"data.template_max_width={HARD_MAX_WIDTH + 1}")


def test_safe_templates_still_format():
    assert format_prompt(RECORD, "classification", ["neg", "pos"],
                         "[{lang}] {text!r:>9}|{labels}") == "[en]   'hello'|neg, pos"
    assert format_prompt(RECORD, "classification", None, "{{x}} {text:.3}") == "{x} hel"


_PIECES = st.sampled_from(["{", "}", "text", "label", ":", ">", "^", "<", ".", "!", "r", "a",
                           "[0]", ".__class__", "0", "9", "99999", "x", " ", "{{", "}}", "_"])


@settings(deadline=None, derandomize=True, database=None, max_examples=400)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_any_template_is_refused_or_formats_within_its_bound(template):
    """Fuzz: a random template is refused with ValueError, or formats a record into at
    most its own length plus, per field, the field's text and the width limit."""
    if not template:  # no template: the task's default
        return
    try:
        check_template(template, 1000)
    except ValueError:
        return
    try:
        out = format_prompt(RECORD, "classification", ["neg", "pos"], template)
    except DataError:  # an unknown field, or a spec that does not fit the value's type
        return
    fields = template.count("{")
    assert len(out) <= len(template) + fields * (1000 + 20)  # no value is over 20 characters
