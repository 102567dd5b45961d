"""Client-side differential privacy: clip + Gaussian noise on a round's update, and an accountant.

Mechanism (per client, per round), applied to what the client sends:

* ``delta = update - reference`` (the client's *change*; ``reference=None`` means the
  update already is a change);
* clip ``delta`` to global L2 norm ``clip_norm`` (the sensitivity);
* add i.i.d. ``N(0, (noise_multiplier * clip_norm)^2)`` noise to every coordinate;
* send ``reference + noisy delta``.

Only floating tensors are privatized. **Integer (and bool) tensors pass through
unchanged**, e.g. BatchNorm's ``num_batches_tracked``: they are released in the clear
and are *not* covered by the DP guarantee.

Accounting uses Renyi differential privacy (RDP):

* Gaussian mechanism with sensitivity ``clip_norm`` and std ``z * clip_norm``:
  ``RDP(alpha) = alpha / (2 z^2)`` (Mironov, "Renyi Differential Privacy", CSF 2017,
  Prop. 7 / Table 2);
* composition over ``T`` rounds adds RDP: ``T * RDP(alpha)`` (Mironov 2017, Prop. 1);
* with client sampling rate ``q < 1`` (Poisson sampling, add/remove-one adjacency), the
  sampled Gaussian mechanism's RDP at integer ``alpha`` is ``log(A_alpha) / (alpha - 1)``
  with ``A_alpha = sum_k C(alpha,k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2))``
  (Mironov, Talwar, Zhang, "Renyi Differential Privacy of the Sampled Gaussian
  Mechanism", 2019, Sec. 3.3), evaluated in log space;
* conversion to ``(epsilon, delta)``: by default Mironov 2017 Prop. 3,
  ``epsilon = min_alpha RDP(alpha) + log(1/delta) / (alpha - 1)``; optionally the tighter
  Balle et al. 2020 ("Hypothesis Testing Interpretations and Renyi Differential
  Privacy", Thm. 21) ``epsilon = RDP + log((alpha-1)/alpha) - (log delta + log alpha) / (alpha-1)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = [
    "DEFAULT_ORDERS",
    "Conversion",
    "GaussianAccountant",
    "add_gaussian_noise",
    "budget",
    "client_noise_multiplier",
    "clip_update",
    "gaussian_rdp",
    "noise_share",
    "privatize",
    "round_epsilon",
    "rdp_to_epsilon",
    "update_norm",
]

DEFAULT_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 10, 12, 14, 16,
    20, 24, 28, 32, 48, 64, 128, 256,
)

Conversion = Literal["mironov", "balle"]


# --------------------------------------------------------------------------- validation


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(name: str, value: float) -> float:
    if not _is_real(value) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _check_delta(delta: float) -> float:
    if not _is_real(delta) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def _check_rate(sampling_rate: float) -> float:
    if not _is_real(sampling_rate) or not 0.0 < sampling_rate <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    return float(sampling_rate)


def _first_non_finite(update: Mapping[str, Tensor]) -> str | None:
    for key in sorted(update):
        t = update[key]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return key
    return None


# --------------------------------------------------------------------------- mechanism


def update_norm(update: Mapping[str, Tensor]) -> float:
    """Global L2 norm over all floating tensors of ``update`` (accumulated in float64)."""
    total = torch.zeros((), dtype=torch.float64)
    for t in update.values():
        if t.is_floating_point():
            total += t.detach().to(device="cpu", dtype=torch.float64).pow(2).sum()
    return math.sqrt(float(total))


def clip_update(update: Mapping[str, Tensor], max_norm: float) -> tuple[dict[str, Tensor], float]:
    """Scale every floating tensor by ``min(1, max_norm / norm)``; return ``(clipped, norm)``.

    ``norm`` is the pre-clip global L2 norm. Dtypes and devices are kept; a zero norm
    (or one within the bound) leaves values unchanged, and tensors that are not scaled
    (integer tensors, or all when no clipping happens) are returned as-is, not copied.
    Raises ``ValueError`` naming the key of a non-finite tensor.
    """
    max_norm = _positive("max_norm", max_norm)
    norm = update_norm(update)
    if not math.isfinite(norm):
        bad = _first_non_finite(update)
        if bad is None:
            raise ValueError("update norm overflows float64")
        raise ValueError(f"update[{bad!r}] has non-finite values (NaN or Inf)")
    if norm <= max_norm:  # includes norm == 0
        return dict(update), norm
    factor = max_norm / norm
    out: dict[str, Tensor] = {}
    for key, t in update.items():
        if t.is_floating_point():
            out[key] = (t.detach().to(torch.float64) * factor).to(t.dtype)
        else:
            out[key] = t
    return out, norm


def add_gaussian_noise(
    update: Mapping[str, Tensor], std: float, generator: torch.Generator
) -> dict[str, Tensor]:
    """Add i.i.d. ``N(0, std^2)`` noise to every floating tensor of ``update``.

    Noise is drawn in float64 on the CPU from ``generator``, in sorted key order, so a
    given generator state gives the same result on any device; each result is cast back
    to its tensor's dtype and device. Integer tensors pass through unchanged.
    """
    if not _is_real(std) or not math.isfinite(std) or std < 0:
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    out: dict[str, Tensor] = dict(update)
    for key in sorted(update):
        t = update[key]
        if not t.is_floating_point():
            continue
        noise = torch.randn(tuple(t.shape), generator=generator, dtype=torch.float64) * std
        noisy = t.detach().to(device="cpu", dtype=torch.float64) + noise
        out[key] = noisy.to(device=t.device, dtype=t.dtype)
    return out


def privatize(
    update: Mapping[str, Tensor],
    reference: Mapping[str, Tensor] | None,
    *,
    clip_norm: float,
    noise_multiplier: float,
    seed: int,
) -> tuple[dict[str, Tensor], dict[str, float]]:
    """Gaussian mechanism on the client's change: ``reference + clip(update - reference) + noise``.

    ``reference=None`` means zeros (``update`` already is a delta). Noise has std
    ``noise_multiplier * clip_norm`` and comes from ``torch.Generator().manual_seed(seed)``.
    The delta is formed, clipped and noised in float64; results keep ``update``'s dtypes
    and devices. Integer tensors of ``update`` pass through unchanged (not privatized).

    Returns ``(released, stats)`` with ``stats = {"dp/norm": pre-clip norm of the delta,
    "dp/clipped": 1.0 if it exceeded clip_norm else 0.0}``. Raises ``ValueError``
    naming the key on missing/extra keys, shape mismatches or non-finite values.
    """
    clip_norm = _positive("clip_norm", clip_norm)
    noise_multiplier = _positive("noise_multiplier", noise_multiplier)
    if reference is not None:
        missing = sorted(set(update) - set(reference))
        extra = sorted(set(reference) - set(update))
        if missing:
            raise ValueError(f"reference lacks key {missing[0]!r} present in the update")
        if extra:
            raise ValueError(f"update lacks key {extra[0]!r} present in the reference")
    for key in sorted(update):
        t = update[key]
        if reference is not None and tuple(reference[key].shape) != tuple(t.shape):
            raise ValueError(
                f"shape mismatch for key {key!r}: update {tuple(t.shape)} "
                f"vs reference {tuple(reference[key].shape)}"
            )
        if not t.is_floating_point():
            continue
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"update[{key!r}] has non-finite values (NaN or Inf)")
        if reference is not None and reference[key].is_floating_point() and not bool(
            torch.isfinite(reference[key]).all()
        ):
            raise ValueError(f"reference[{key!r}] has non-finite values (NaN or Inf)")

    delta: dict[str, Tensor] = {}
    for key, t in update.items():
        if not t.is_floating_point():
            continue
        d = t.detach().to(device="cpu", dtype=torch.float64)
        if reference is not None:
            d = d - reference[key].detach().to(device="cpu", dtype=torch.float64)
        delta[key] = d
    clipped, norm = clip_update(delta, clip_norm)
    noisy = add_gaussian_noise(
        clipped, noise_multiplier * clip_norm, torch.Generator().manual_seed(seed)
    )

    out: dict[str, Tensor] = {}
    for key, t in update.items():
        if not t.is_floating_point():
            out[key] = t
            continue
        value = noisy[key]
        if reference is not None:
            value = reference[key].detach().to(device="cpu", dtype=torch.float64) + value
        out[key] = value.to(device=t.device, dtype=t.dtype)
    stats = {"dp/norm": norm, "dp/clipped": 1.0 if norm > clip_norm else 0.0}
    return out, stats


# --------------------------------------------------------------------------- accounting


def _logsumexp(terms: Sequence[float]) -> float:
    m = max(terms)
    if m == -math.inf:
        return -math.inf
    return m + math.log(math.fsum(math.exp(t - m) for t in terms))


def _sampled_gaussian_rdp_int(q: float, z: float, alpha: int) -> float:
    # MTZ 2019 Sec. 3.3: A_alpha = sum_{k=0}^{alpha} C(alpha,k) (1-q)^(alpha-k) q^k
    #                                exp((k^2 - k) / (2 z^2)),   RDP = log(A_alpha) / (alpha-1)
    log_q, log_1mq = math.log(q), math.log1p(-q)
    terms = [
        math.log(math.comb(alpha, k)) + (alpha - k) * log_1mq + k * log_q
        + (k * k - k) / (2.0 * z * z)
        for k in range(alpha + 1)
    ]
    return max(_logsumexp(terms), 0.0) / (alpha - 1)  # A_alpha >= 1 exactly; clamp rounding


def _resolve_orders(orders: Sequence[float] | None, q: float) -> list[float]:
    if orders is None:
        return [float(a) for a in DEFAULT_ORDERS if q == 1.0 or float(a).is_integer()]
    out = []
    for a in orders:
        if not _is_real(a) or not math.isfinite(a) or a <= 1:
            raise ValueError(f"orders must be finite numbers > 1, got {a!r}")
        if q < 1.0 and not float(a).is_integer():
            raise ValueError(
                f"orders must be integers when sampling_rate < 1 (MTZ 2019 closed form), got {a!r}"
            )
        out.append(float(a))
    if not out:
        raise ValueError("orders must not be empty")
    return out


def gaussian_rdp(
    noise_multiplier: float,
    orders: Sequence[float] | None = None,
    sampling_rate: float = 1.0,
) -> list[float]:
    """Per-round RDP of the (sub)sampled Gaussian mechanism at each order.

    ``q = 1``: ``alpha / (2 z^2)`` (Mironov 2017). ``q < 1``: the MTZ 2019 integer-order
    bound, computed in log space; orders must then be integers. ``orders=None`` uses
    ``DEFAULT_ORDERS`` (only its integers when ``q < 1``). Compose over rounds by
    multiplying by the number of rounds.
    """
    z = _positive("noise_multiplier", noise_multiplier)
    q = _check_rate(sampling_rate)
    resolved = _resolve_orders(orders, q)
    if q == 1.0:
        return [a / (2.0 * z * z) for a in resolved]  # Mironov 2017, Gaussian: alpha / (2 sigma^2)
    return [_sampled_gaussian_rdp_int(q, z, int(a)) for a in resolved]


def rdp_to_epsilon(
    rdp: Sequence[float],
    orders: Sequence[float],
    delta: float,
    *,
    conversion: Conversion = "mironov",
) -> tuple[float, float]:
    """Smallest ``epsilon`` over ``orders`` for total RDP ``rdp``; returns ``(epsilon, order)``.

    Default ``conversion="mironov"`` (Mironov 2017 Prop. 3):
    ``epsilon = rdp + log(1/delta) / (alpha - 1)``. ``conversion="balle"`` (Balle et al.
    2020, tighter): ``epsilon = rdp + log((alpha-1)/alpha) - (log delta + log alpha)/(alpha-1)``,
    floored at 0. Infinite RDP values are skipped (epsilon ``inf`` if all are).
    """
    delta = _check_delta(delta)
    if len(rdp) != len(orders) or not orders:
        raise ValueError(
            f"rdp and orders must be non-empty and of equal length, got {len(rdp)} and {len(orders)}"
        )
    if conversion not in ("mironov", "balle"):
        raise ValueError(f"conversion must be 'mironov' or 'balle', got {conversion!r}")
    best, best_order = math.inf, float("nan")
    for r, a in zip(rdp, orders, strict=True):
        a = float(a)
        if not a > 1:
            raise ValueError(f"orders must be > 1, got {a!r}")
        if math.isnan(r) or r < 0:
            raise ValueError(f"rdp must be >= 0, got {r!r} at order {a}")
        if conversion == "mironov":
            eps = r + math.log(1.0 / delta) / (a - 1.0)  # Mironov 2017 Prop. 3
        else:
            # Balle et al. 2020 Thm. 21
            eps = r + math.log((a - 1.0) / a) - (math.log(delta) + math.log(a)) / (a - 1.0)
            eps = max(eps, 0.0)
        if eps < best:
            best, best_order = eps, a
    return best, best_order


@dataclass
class GaussianAccountant:
    """Running ``(epsilon, delta)`` of the Gaussian mechanism repeated over rounds (RDP).

    ``step(n)`` records ``n`` more rounds; ``epsilon`` / ``spent()`` report the privacy
    spent so far (0 before any round). ``conversion`` defaults to Mironov 2017 Prop. 3.
    With ``sampling_rate < 1`` the default orders are the integer ones.
    """

    noise_multiplier: float
    delta: float
    sampling_rate: float = 1.0
    orders: Sequence[float] | None = None
    conversion: Conversion = "mironov"
    steps: int = field(default=0)
    _rdp_per_step: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.noise_multiplier = _positive("noise_multiplier", self.noise_multiplier)
        self.delta = _check_delta(self.delta)
        self.sampling_rate = _check_rate(self.sampling_rate)
        if self.conversion not in ("mironov", "balle"):
            raise ValueError(f"conversion must be 'mironov' or 'balle', got {self.conversion!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {self.steps!r}")
        self.orders = tuple(_resolve_orders(self.orders, self.sampling_rate))
        self._rdp_per_step = gaussian_rdp(self.noise_multiplier, self.orders, self.sampling_rate)

    def step(self, n: int = 1) -> float:
        """Record ``n`` more rounds; returns the new ``epsilon``."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        self.steps += n
        return self.epsilon

    @property
    def rdp(self) -> list[float]:
        """Total RDP after ``steps`` rounds (composition: ``steps * per-round RDP``)."""
        return [self.steps * r for r in self._rdp_per_step]

    def _spent(self) -> tuple[float, float]:
        if self.steps == 0:
            return 0.0, float("nan")
        assert self.orders is not None
        return rdp_to_epsilon(self.rdp, self.orders, self.delta, conversion=self.conversion)

    @property
    def epsilon(self) -> float:
        """``epsilon`` spent so far at ``self.delta``."""
        return self._spent()[0]

    def spent(self) -> dict[str, float]:
        """``{"dp/epsilon", "dp/delta", "dp/order", "dp/rounds"}``; order is NaN before a round."""
        eps, order = self._spent()
        return {
            "dp/epsilon": eps,
            "dp/delta": self.delta,
            "dp/order": order,
            "dp/rounds": float(self.steps),
        }


def noise_share(noise: str, clients_per_round: int, min_replies: int | None) -> int:
    """``m``: each client's noise is the full noise divided by ``sqrt(m)``.

    ``local``: 1 (every client adds all of it).  ``distributed``: the fewest clients whose
    uploads a round's secure sum may hold, ``clients.min_replies`` (else every client of
    the round), so that any sum the server can obtain carries at least the full noise.
    """
    if noise == "local":
        return 1
    if noise != "distributed":
        raise ValueError(f"noise must be 'local' or 'distributed', got {noise!r}")
    return max(1, min(clients_per_round, min_replies or clients_per_round))


def client_noise_multiplier(dp: Any, per_round: int, min_replies: int | None) -> float:
    """The noise multiplier each client adds under ``differential_privacy`` settings ``dp``:
    ``dp.noise_multiplier / sqrt(m)``, m = :func:`noise_share` (``per_round``: clients a
    round asks; ``min_replies``: ``clients.min_replies``)."""
    return dp.noise_multiplier / math.sqrt(noise_share(dp.noise, per_round, min_replies))


def budget(dp: Any, rounds: int, per_round: int, min_replies: int | None) -> dict[str, float]:
    """The budget each client has spent after ``rounds`` rounds under settings ``dp``, as
    the server logs it (:func:`round_epsilon`; arguments as :func:`client_noise_multiplier`)."""
    share = noise_share(dp.noise, per_round, min_replies)
    return round_epsilon(dp.clip_norm, dp.noise_multiplier, dp.delta, rounds, share)


def round_epsilon(clip_norm: float, noise_multiplier: float, delta: float, rounds: int,
                  share: int = 1) -> dict[str, float]:
    """What the server logs each round: :func:`upload_epsilon`, and with distributed noise
    (``share`` m > 1, :func:`noise_share`) ``dp_epsilon`` is the guarantee of the secure
    sum (which holds the full noise) against the server, and ``dp_epsilon_upload`` that
    of one upload alone (noise multiplier ``z / sqrt(m)``): against the server colluding
    with every other client of the round."""
    out = upload_epsilon(clip_norm, noise_multiplier, delta, rounds)
    if share > 1:
        alone = upload_epsilon(clip_norm, noise_multiplier / math.sqrt(share), delta, rounds)
        out["dp_epsilon_upload"] = alone["dp_epsilon"]
    return out


def upload_epsilon(clip_norm: float, noise_multiplier: float, delta: float, rounds: int
                   ) -> dict[str, float]:
    """The epsilon of one client's uploads after ``rounds`` rounds, as the server reports it.

    Adjacency is *replacing* the client's whole local dataset, so one upload can move by
    ``2 * clip_norm`` (the clipped change goes from ``+c`` to ``-c``): the mechanism is a
    Gaussian with sensitivity ``2 C`` and std ``z C``, i.e. noise multiplier ``z / 2``.
    This is the local guarantee against a server that sees each upload; under secure
    aggregation the server sees only the sum, which carries every client's noise.
    """
    _positive("clip_norm", clip_norm)
    acc = GaussianAccountant(noise_multiplier=noise_multiplier / 2, delta=delta)
    acc.step(rounds)
    return {"dp_epsilon": acc.epsilon, "dp_delta": delta}
