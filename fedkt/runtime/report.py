"""One round, typed: what the server and each asked client reported, once.

A round's numbers come from three places: the server's ``round()`` (its metrics, flat
``split/name`` keys, and the privacy budget the runner adds), its ``evaluate()`` (one
entry per server-side participant) and the clients' replies, which the transport counts
in a :class:`~fedkt.runtime.base.Traffic` (bytes, seconds, metrics, exclusions).
:func:`round_report` gathers them into one :class:`RoundReport`; the runner logs its
:meth:`RoundReport.rows` (round 0, where every model is only evaluated:
:meth:`RoundReport.evaluation_rows`), and nothing else reads the traffic for rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedkt.runtime.replies import SERVER_ROW_KEYS

if TYPE_CHECKING:
    from fedkt.runtime.base import Traffic

__all__ = ["ClientReport", "RoundReport", "round_report", "server_participants", "split_metrics"]


def split_metrics(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{"train/loss": 1, "test/accuracy": .5}`` -> ``{"train": {...}, "test": {...}}``
    (a key without a split is ``train``'s).

    Names of the server's own row keys (``round``, ``participant``, ...) are dropped: a
    client's metrics never stand in for them (its reply check refuses them first,
    :mod:`fedkt.runtime.replies`)."""
    out: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        split, _, name = key.rpartition("/")
        if name not in SERVER_ROW_KEYS:
            out.setdefault(split or "train", {})[name] = value
    return out


@dataclass(frozen=True)
class ClientReport:
    """One asked client's part of a round, from the server's side of the wire."""

    cid: int
    metrics: dict[str, dict[str, float]]  # by split: "train" (with its seconds per phase), ...
    bytes_sent: int  # client -> server: the method's payloads (evaluation bytes apart)
    bytes_received: int  # server -> client
    wall_time: float  # the client's seconds, as its replies report them
    compute_time: float  # without its evaluation
    compute_cpu: float  # the same, CPU seconds of its process
    excluded: str | None = None  # why the round left it out (its metrics are then empty)
    eval_bytes: int = 0  # the per-example predictions it sent back

    def rows(self, rnd: int) -> list[dict[str, Any]]:
        """Its train row (train metrics, bytes, seconds, ``excluded``, ``eval_bytes``),
        then a row per other split."""
        participant = f"client_{self.cid}"
        row: dict[str, Any] = {
            "round": rnd, "participant": participant, "split": "train",
            **self.metrics.get("train", {}), "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received, "wall_time": self.wall_time,
            "compute_time": self.compute_time, "compute_cpu": self.compute_cpu}
        if self.excluded is not None:
            row["excluded"] = self.excluded
        if self.eval_bytes:
            row["eval_bytes"] = self.eval_bytes
        return [row] + [{"round": rnd, "participant": participant, "split": split, **values}
                        for split, values in self.metrics.items() if split != "train"]


@dataclass(frozen=True)
class RoundReport:
    """Everything round ``round`` reported: the server's metrics by split (its train
    metrics with the privacy budget; its own test metrics), the evaluation of each
    server-side participant, each asked client's :class:`ClientReport`, how many clients'
    replies were used, and the server's seconds (wall, compute, per phase)."""

    round: int
    server: dict[str, dict[str, float]]
    evaluated: dict[str, dict[str, float]] = field(default_factory=dict)
    clients: list[ClientReport] = field(default_factory=list)
    clients_replied: int = 0
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def bytes_sent(self) -> int:
        """Server -> clients, over the round."""
        return sum(c.bytes_received for c in self.clients)

    @property
    def bytes_received(self) -> int:
        """Clients -> server, over the round (evaluation bytes apart)."""
        return sum(c.bytes_sent for c in self.clients)

    def rows(self) -> list[dict[str, Any]]:
        """The metrics rows, in the order they are logged: the server's train row (its
        train metrics, the round's bytes, ``clients_replied``, its seconds), its test row
        (its own test metrics and its evaluation), a test row per other server-side
        model, then each client's rows (:meth:`ClientReport.rows`)."""
        rnd = self.round
        rows: list[dict[str, Any]] = [{
            "round": rnd, "participant": "server", "split": "train",
            **self.server.get("train", {}), "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received, "clients_replied": self.clients_replied,
            **self.timing}]
        if "test" in self.server or "server" in self.evaluated:
            rows.append({"round": rnd, "participant": "server", "split": "test",
                         **self.server.get("test", {}), **self.evaluated.get("server", {})})
        rows += [{"round": rnd, "participant": name, "split": "test", **values}
                 for name, values in self.evaluated.items() if name != "server"]
        for client in self.clients:
            rows += client.rows(rnd)
        return rows

    def evaluation_rows(self) -> list[dict[str, Any]]:
        """Round 0's rows (every model evaluated, nothing trained): a test row per
        server-side participant, the first with the server's seconds, then a test row per
        client that evaluated, with its seconds per phase."""
        rows: list[dict[str, Any]] = []
        timing = dict(self.timing)
        for name, values in self.evaluated.items():
            rows.append({"round": self.round, "participant": name, "split": "test",
                         **values, **timing})
            timing = {}
        for client in self.clients:
            if client.metrics.get("test"):
                seconds = {k: v for k, v in client.metrics.get("train", {}).items()
                           if k.endswith("_seconds")}
                rows.append({"round": self.round, "participant": f"client_{client.cid}",
                             "split": "test", **client.metrics["test"], **seconds})
        return rows


def round_report(rnd: int, server: dict[str, dict[str, float]],
                 evaluated: dict[str, dict[str, float]], cids: list[int], traffic: Traffic,
                 timing: dict[str, float]) -> RoundReport:
    """Round ``rnd``'s report from the server's metrics by split, its evaluation
    (``{participant: metrics}``), the round's clients ``cids`` and its
    :class:`~fedkt.runtime.base.Traffic`; a client the round sent nothing is not in it."""
    clients = [ClientReport(
        cid=cid, metrics=split_metrics(traffic.metrics.get(cid, {})),
        bytes_sent=traffic.received.get(cid, 0), bytes_received=traffic.sent.get(cid, 0),
        wall_time=traffic.seconds.get(cid, 0.0), compute_time=traffic.compute[cid].wall,
        compute_cpu=traffic.compute[cid].cpu, excluded=traffic.excluded.get(cid),
        eval_bytes=traffic.eval_bytes.get(cid, 0))
        for cid in cids if cid in traffic.sent]
    return RoundReport(round=rnd, server=server, evaluated=evaluated, clients=clients,
                       clients_replied=len(cids) - len(traffic.excluded), timing=timing)


def server_participants(metrics: dict[str, Any] | None) -> dict[str, dict[str, float]]:
    """:meth:`Server.evaluate`'s result as ``{participant: metrics}``: a flat dict is the
    ``server`` participant's; a dict of dicts names several (FedCoLLM's LLM and global SLM)."""
    if not metrics:
        return {}
    if all(isinstance(v, dict) for v in metrics.values()):
        return metrics
    return {"server": metrics}
