"""A pilot's choice: which arm a later suite tests, by a rule the suite file declares before
it runs, applied by ``fedkt suite report`` rather than by hand.

    choice:
      among: [fedmkt, rehearse, anchor, rehearse_t2]     # the candidate arms
      keep: {metric: server.accuracy_srv, against: fedmkt_none, margin: 0.03}
      best: server.accuracy_cli                            # the highest mean wins
      ties: {within: 0.01, by: server.accuracy}

From each arm's mean over the suite's runs (every seed and fold): an arm of ``among`` is
eligible when its ``keep.metric`` is at least ``keep.against``'s less ``margin`` (with no
``keep``, every arm is).  Of the eligible, the highest ``best`` wins; the arms within
``ties.within`` of it are decided by ``ties.by`` (then by ``best``, then by their order in
``among``).  If none is eligible, the arm with the highest ``keep.metric`` (the one losing
least) is chosen, and the choice says so.  A choice needs every run of its arms: until
then it is not computed.  It decides nothing by itself (the claims do); it records which
arm the next suite tests and why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator

from fedkt.config import _Strict
from fedkt.tracking.tables import format_table


def _group_metric(text: str) -> str:
    parts = text.split(".")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"{text!r}: write GROUP.METRIC, e.g. 'server.accuracy_cli'")
    return text


GroupMetric = Annotated[str, AfterValidator(_group_metric)]  # "GROUP.METRIC"


class KeepRule(_Strict):
    """An arm is eligible when its ``metric`` is at least ``against``'s less ``margin``."""

    metric: GroupMetric
    against: str = Field(..., min_length=1)
    margin: float = Field(0.0, ge=0)


class TieRule(_Strict):
    """Arms within ``within`` of the best are decided by ``by``."""

    within: float = Field(..., ge=0)
    by: GroupMetric


class ChoiceRule(_Strict):
    """``choice:`` of a suite file (see the module docstring)."""

    among: list[str] = Field(..., min_length=2)
    keep: KeepRule | None = None
    best: GroupMetric
    ties: TieRule | None = None

    @field_validator("among")
    @classmethod
    def _distinct(cls, among: list[str]) -> list[str]:
        if len(set(among)) != len(among):
            raise ValueError(f"{among} repeats an arm")
        return among


def check_choice(rule: ChoiceRule, arms: set[str], groups: list[str]) -> None:
    """Refuse a rule that names an arm the suite lacks or a group its table does not show."""
    named = [("choice.among", a) for a in rule.among]
    if rule.keep is not None:
        named.append(("choice.keep.against", rule.keep.against))
    for field, arm in named:
        if arm not in arms:
            raise ValueError(f"{field}: {arm!r} is not an arm of the suite ({sorted(arms)})")
    metrics = [("choice.best", rule.best)]
    if rule.keep is not None:
        metrics.append(("choice.keep.metric", rule.keep.metric))
    if rule.ties is not None:
        metrics.append(("choice.ties.by", rule.ties.by))
    for field, text in metrics:
        group = text.split(".")[0]
        if group not in groups:
            raise ValueError(f"{field}: group {group!r} is not one of the suite's groups "
                             f"({groups})")


Mean = Callable[[str, str], float | None]  # (arm, "GROUP.METRIC") -> mean over its runs


def choose(rule: ChoiceRule, mean: Mean, missing: list[str] | None = None) -> dict[str, Any]:
    """suite.json's ``choice``: each candidate's row, the chosen arm and why.  ``missing``:
    the suite's unfinished runs (``"ARM seed S"``); one of the rule's arms there leaves the
    choice not computed."""
    arms = [*rule.among, *([rule.keep.against] if rule.keep else [])]
    waiting = [m for m in missing or [] if m.split(" seed ")[0] in arms]
    base = {"among": rule.among, "rule": rule.model_dump(mode="json")}

    def not_computed(why: str) -> dict[str, Any]:
        return {**base, "chosen": None, "rows": [], "reason": f"not computed: {why}"}

    if waiting:
        return not_computed(f"{len(waiting)} of its arms' runs not finished "
                            f"({', '.join(waiting[:4])}{', ...' if len(waiting) > 4 else ''})")
    bar = None
    if rule.keep is not None:
        against = mean(rule.keep.against, rule.keep.metric)
        if against is None:
            return not_computed(f"{rule.keep.against} has no {rule.keep.metric}")
        bar = against - rule.keep.margin
    rows = []
    for arm in rule.among:
        best = mean(arm, rule.best)
        keep = mean(arm, rule.keep.metric) if rule.keep else None
        tie = mean(arm, rule.ties.by) if rule.ties else None
        if best is None or (rule.keep and keep is None) or (rule.ties and tie is None):
            return not_computed(f"{arm} lacks a metric the rule reads")
        rows.append({"arm": arm, "keep": keep, "bar": bar, "best": best, "tie": tie,
                     "eligible": bar is None or keep >= bar - 1e-12})  # float error
    eligible = [r for r in rows if r["eligible"]]
    order = {arm: i for i, arm in enumerate(rule.among)}
    if eligible:
        top = max(r["best"] for r in eligible)
        within = rule.ties.within if rule.ties else 0.0
        close = [r for r in eligible if r["best"] >= top - within - 1e-12]
        chosen = min(close, key=lambda r: (-(r["tie"] if r["tie"] is not None else 0.0),
                                           -r["best"], order[r["arm"]]))
        if len(close) > 1:
            reason = (f"eligible: {len(eligible)} of {len(rows)}; {len(close)} within "
                      f"{within:g} of the best {rule.best} ({top:.3f}), the highest "
                      f"{rule.ties.by if rule.ties else rule.best} of them")
        else:
            reason = (f"eligible: {len(eligible)} of {len(rows)}; the highest {rule.best} "
                      f"({top:.3f})")
    else:
        chosen = min(rows, key=lambda r: (-r["keep"], order[r["arm"]]))
        reason = (f"none eligible ({rule.keep.metric} at least {bar:.3f}, "
                  f"{rule.keep.against}'s less {rule.keep.margin:g}): the arm losing least "
                  f"of it")
    for r in rows:
        r["chosen"] = r is chosen
    return {**base, "chosen": chosen["arm"], "eligible_any": bool(eligible), "rows": rows,
            "reason": reason}


def choice_markdown(result: dict[str, Any]) -> str:
    """The section of ``suite.md`` that shows a :func:`choose` result."""
    rule = result["rule"]
    keep = rule.get("keep")
    ties = rule.get("ties")
    lines = ["The rule, declared in the suite file before it ran: of "
             + ", ".join(f"`{a}`" for a in result["among"])
             + (f", an arm is eligible when its mean `{keep['metric']}` is at least "
                f"`{keep['against']}`'s less {keep['margin']:g}" if keep else "")
             + f"; of the eligible, the highest mean `{rule['best']}` wins"
             + (f" (within {ties['within']:g} of it: the highest `{ties['by']}`)"
                if ties else "")
             + (f"; if none is eligible, the highest `{keep['metric']}`." if keep else ".")
             + " Means over every run of the arm; the choice decides nothing by itself.", ""]
    if result["chosen"] is None:
        return "\n".join([*lines, f"Chosen: none ({result['reason']})."])
    header = ["arm"]
    if keep:
        header += [f"`{keep['metric']}`", "at least", "eligible"]
    header.append(f"`{rule['best']}`")
    if ties:
        header.append(f"`{ties['by']}`")
    table = []
    for r in result["rows"]:
        line = [f"**{r['arm']}**" if r["chosen"] else r["arm"]]
        if keep:
            line += [f"{r['keep']:.3f}", f"{r['bar']:.3f}", "yes" if r["eligible"] else "no"]
        line.append(f"{r['best']:.3f}")
        if ties:
            line.append(f"{r['tie']:.3f}")
        table.append(line)
    lines += [format_table(header, table, markdown=True), "",
              f"Chosen: **{result['chosen']}** ({result['reason']})."]
    return "\n".join(lines)
