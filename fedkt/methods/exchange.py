"""A global model whose updates travel, SVD-compressed or raw: FedKD's exchange (Eqs. 8-9).

Shared by FedKD (the student) and encoder FedAvg (the whole model, raw by default), so
that both send the same kind of messages and their bytes compare.  Every client keeps a
copy of the global trainable state, the object ``"global"`` of
:mod:`fedkt.methods.holdings`, version = the round whose aggregate it includes (0: the
initial model every party builds from the seed).  A round:

1. :func:`aggregate_updates`: each client trains from its copy (sent whole to a client
   that does not hold the current version) and uploads ``new - received``, factorised
   with the round's energy threshold ``T`` (Eq. 8; raw without compression); the server
   decodes and averages the updates (FedAvg, example-weighted) and factorises the mean
   with the same ``T``;
2. :func:`apply_update`: the server adds that reconstruction to the global state;
3. :func:`sync_clients`: every client adds the same reconstruction to its copy
   (:func:`client_adopt`, the ``adopt`` handler), so client and server copies stay equal.

``T`` rises linearly over the rounds (Eq. 9, :func:`round_threshold`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from torch import Tensor

from fedkt.config.method_settings import ExchangeSettings as ExchangeSettings  # re-exported
from fedkt.federated.compression import (
    CompressedTensor,
    compressed_nbytes,
    decode_update,
    decompress_state,
    dense_nbytes,
    encode_update,
    from_payload,
    threshold_schedule,
)
from fedkt.federated.payload import Payload, PayloadError
from fedkt.methods.base import ClientContext, Clients, mean_metric
from fedkt.methods.holdings import Holdings

__all__ = ["GLOBAL", "ExchangeSettings", "aggregate_updates", "apply_update", "client_adopt",
           "round_threshold", "sync_clients", "upload_update"]

State = dict[str, Tensor]
GLOBAL = "global"  # the held object: each client's copy of the global trainable state


def round_threshold(method: ExchangeSettings, rnd: int, rounds: int) -> float | None:
    """Eq. 9 energy threshold of round ``rnd`` (1-based); None without compression."""
    if not method.compress:
        return None
    return threshold_schedule(rnd - 1, rounds, method.T_start, method.T_end,
                              convention=method.schedule)


# --------------------------------------------------------------------------- server side


def aggregate_updates(clients: Clients, holdings: Holdings, handler: str, state: State,
                      version: int, T: float | None, weighted: bool
                      ) -> tuple[dict[int, Payload], State, dict[str, float]]:
    """Step 1: ``handler`` trains every client from the global ``state`` at ``version``;
    the weighted mean of their decoded updates, encoded with ``T`` (what the clients will
    apply), the replies and the metrics (traffic ratios, mean loss, ``T``).

    Under secure aggregation the clients upload their reconstructed (dense) updates and
    SecAgg+ sums them.
    """
    asked = list(clients.ids)
    extra = {} if T is None else {"T": T}
    msgs = {cid: holdings.offer(Payload(extra), cid, GLOBAL, version, state) for cid in asked}
    sent: list[int] = []

    def decode(cid: int, reply: Payload) -> State:
        try:
            comp = decode_update(reply.state("update", source=f"client {cid}"), state,
                                 f"client {cid}: field 'update'")
        except ValueError as exc:
            raise PayloadError(str(exc)) from None
        sent.append(compressed_nbytes(comp))
        return decompress_state(comp)

    replies, mean = clients.aggregate(handler, msgs, field="update", like=state,
                                      weighted=weighted, decode=decode)
    holdings.confirm(asked, replies, GLOBAL, version)  # the clients that replied kept it
    encoded = encode_update(mean, T)  # the server compresses the aggregate the same way
    dense = dense_nbytes(state)
    up = sum(sent) / len(sent) if sent else dense  # secure aggregation: dense uploads
    metrics = {"train/upload_ratio": dense / max(1, up),
               "train/download_ratio": dense / max(1, compressed_nbytes(from_payload(encoded)))}
    loss = mean_metric(replies, "train/loss", [c for c, r in replies.items()
                                               if r.get("num_examples")])
    if loss is not None:
        metrics["train/loss"] = loss
    if T is not None:
        metrics["train/T"] = T
    return replies, encoded, metrics


def apply_update(state: State, update: Mapping[str, CompressedTensor]) -> State:
    """Step 2: ``state`` plus the reconstruction of a decoded ``update``
    (:func:`~fedkt.federated.compression.from_payload` of what travelled): the server and every
    client add exactly the same tensors."""
    applied = decompress_state(update)
    return {k: v + applied[k] for k, v in state.items()}


def sync_clients(clients: Clients, holdings: Holdings, encoded: State, version: int) -> None:
    """Step 3: every client applies ``encoded`` to its copy, which becomes ``version``; a
    client that does not confirm is sent the whole state next round."""
    msg = Payload(update=encoded, **{f"{GLOBAL}_version": version})
    asked = list(clients.ids)
    replies = clients.call("adopt", {cid: msg for cid in asked}, evaluate=False)
    holdings.confirm(asked, replies, GLOBAL, version)


# --------------------------------------------------------------------------- client side


def upload_update(ctx: ClientContext, update: State, T: float | None
                  ) -> tuple[State, float, float]:
    """What a client sends for its update: (tensors, dense/compressed size, seconds of Eq. 8).

    DP (when on) acts on the dense change before compression.  Under secure
    aggregation SecAgg+ masks are dense, so the client sends the low-rank
    reconstruction: Eq. 8's effect on the update, not its bandwidth saving (the
    download stays compressed).
    """
    update = ctx.privatize(update)
    t0 = time.perf_counter()
    encoded = encode_update(update, T)  # Eq. 8
    seconds = time.perf_counter() - t0
    ratio = dense_nbytes(update) / max(1, compressed_nbytes(from_payload(encoded)))
    if ctx.cfg.secure_aggregation.enabled:
        return decompress_state(from_payload(encoded)), 1.0, seconds
    return encoded, ratio, seconds


def client_adopt(ctx: ClientContext, msg: Payload) -> Payload:
    """Handler ``adopt``: apply the server's aggregate to this client's copy of the global
    state (``version - 1``), which becomes ``version``."""
    version = int(msg.number(f"{GLOBAL}_version", source="server", low=1))
    saved = ctx.cached(GLOBAL, version - 1)
    if saved is None:
        raise PayloadError(f"{ctx.name} holds no global state of version {version - 1} to "
                           "update; the server sends it whole next round")
    try:
        comp = decode_update(msg.state("update", source="server"), saved,
                             "server: field 'update'")
    except ValueError as exc:
        raise PayloadError(str(exc)) from None
    ctx.keep(GLOBAL, version, apply_update(saved, comp))
    return Payload()
