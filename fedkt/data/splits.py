"""Public / private / test splits and client partitions, deterministic for a seed.

Randomness comes from ``numpy.random.default_rng([seed, purpose])`` only, so results
do not depend on Python's hash randomisation or on call order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedkt.config import DataConfig, PartitionConfig, SplitConfig
from fedkt.data.classes import filter_classes, parse_class_spec
from fedkt.data.dataset import DataError, Dataset
from fedkt.data.public import load_public_texts, without_labels
from fedkt.data.records import load_dataset_records

# Purposes, so that each random draw has its own stream.
_SPLIT, _TEST_ORDER, _IID, _DIRICHLET, _PUBLIC_ORDER, _BY_FIELD, _FOLDS = 1, 2, 3, 4, 5, 6, 7
_CLASS_DRAW = 8
MAX_DIRICHLET_TRIES = 100


def _rng(seed: int, purpose: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, purpose])


def _count(size: int | float, n: int, what: str) -> int:
    """A count from an int or a fraction of ``n``."""
    if isinstance(size, bool):
        raise DataError(f"{what}: expected a count or a fraction, got {size!r}")
    if isinstance(size, int):
        count = size
    elif 0 < size < 1:
        count = max(1, int(size * n))
    else:
        raise DataError(f"{what}: a fraction must be between 0 and 1 (exclusive), got {size}")
    if not 0 < count < n:
        raise DataError(f"{what} = {size} leaves no training records out of {n}")
    return count


def make_splits(
    dataset: Dataset, split: SplitConfig, num_clients: int, seed: int
) -> dict[str, list[dict[str, Any]]]:
    """Cut a dataset into ``server``, ``public``, ``private_pool`` and ``test`` record lists.

    ``test`` is ``split.test_dataset`` if given; with ``split.folds`` K, fold ``split.fold``
    (default: ``seed``) of one
    cut of the records into K folds (seeded by ``split.fold_seed``, the same for every seed),
    the other folds in the seed's random order being the training part; else a seeded
    holdout of ``test_size``.
    Then ``server`` is the first ``split.server_size`` of the rest (none by default).
    Scheme ``fedmkt``: what is left is cut into ``num_clients + 1`` equal parts, the first
    public and the others, in order, the private pool (client k's part is the pool's
    k-th slice).  Scheme ``holdout``: a ``public_fraction`` of it is public.
    All lists are in seeded random order.
    """
    if num_clients < 1:
        raise DataError(f"num_clients must be at least 1, got {num_clients}")
    records = dataset.records
    n = len(records)
    perm = _rng(seed, _SPLIT).permutation(n)
    if split.test_dataset is not None:
        test_ds = load_dataset_records(split.test_dataset)
        _check_compatible(dataset, test_ds)
        order = _rng(seed, _TEST_ORDER).permutation(len(test_ds.records))
        test = [test_ds.records[i] for i in order]
        train_idx = perm
    elif split.folds is not None:
        fold = run_fold(split, seed)
        test_idx, train_idx = fold_indices(n, split.folds, fold, split.fold_seed)
        test = [records[i] for i in test_idx]
        train_idx = train_idx[_rng(seed, _SPLIT).permutation(len(train_idx))]
    else:
        n_test = _count(split.test_size, n, "split.test_size")
        test = [records[i] for i in perm[:n_test]]
        train_idx = perm[n_test:]

    server_idx = train_idx[:0]
    if split.server_size:
        n_server = _count(split.server_size, len(train_idx), "split.server_size")
        server_idx, train_idx = train_idx[:n_server], train_idx[n_server:]
    n_train = len(train_idx)
    if split.scheme == "fedmkt":
        part = n_train // (num_clients + 1)
        if part < 1:
            raise DataError(
                f"split.scheme fedmkt: {n_train} training records cannot be cut into "
                f"{num_clients + 1} parts (1 public + {num_clients} clients)"
            )
        public_idx = train_idx[:part]
        pool_idx = train_idx[part : part * (num_clients + 1)]
    else:
        n_pub = int(split.public_fraction * n_train)
        if split.public_fraction > 0:
            n_pub = max(1, n_pub)
        public_idx = train_idx[:n_pub]
        pool_idx = train_idx[n_pub:]
    return {
        "server": [records[i] for i in server_idx],
        "public": [records[i] for i in public_idx],
        "private_pool": [records[i] for i in pool_idx],
        "test": test,
    }


def run_fold(split: SplitConfig, seed: int) -> int:
    """The fold a run tests on under ``split.folds``: ``split.fold``, else the seed."""
    return int(seed if split.fold is None else split.fold)


def fold_indices(n: int, folds: int, fold: int, fold_seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """``(test, train)`` record indices of fold ``fold`` of ``n`` records cut into ``folds``
    near-equal folds of one permutation (``fold_seed``): the test indices in the
    permutation's order, the training ones in record order."""
    if not 0 <= fold < folds:
        raise DataError(f"split.folds: fold {fold} of {folds} does not exist (seeds 0..{folds - 1})")
    if n < folds:
        raise DataError(f"split.folds: {n} records cannot be cut into {folds} folds")
    parts = np.array_split(_rng(fold_seed, _FOLDS).permutation(n), folds)
    test = parts[fold]
    inside = np.zeros(n, dtype=bool)
    inside[test] = True
    return test, np.flatnonzero(~inside)


def _check_compatible(train: Dataset, test: Dataset) -> None:
    if train.task != test.task:
        raise DataError(
            f"split.test_dataset {test.name!r} is a {test.task} task but the dataset "
            f"{train.name!r} is {train.task}"
        )
    if (train.task in ("classification", "image_classification")
            and train.label_names != test.label_names):
        raise DataError(
            f"split.test_dataset {test.name!r} has label_names {test.label_names} but "
            f"{train.name!r} has {train.label_names}; give the same label_names to both"
        )


def partition(
    records: list[dict[str, Any]],
    num_clients: int,
    cfg: PartitionConfig,
    seed: int,
    labels: list[Any] | None = None,
) -> list[list[int]]:
    """Indices of ``records`` for each client.

    ``iid``: a seeded shuffle cut into equal parts (the remainder, fewer than
    ``num_clients`` records, is left out).  ``dirichlet``: for each class, client shares
    are drawn from Dirichlet(alpha); draws are repeated (at most
    ``MAX_DIRICHLET_TRIES``) until every client has ``min_size`` records.  Labels default
    to each record's ``"label"``.  ``by_field``: see :func:`field_groups`.
    """
    if num_clients < 1:
        raise DataError(f"num_clients must be at least 1, got {num_clients}")
    n = len(records)
    if cfg.scheme == "iid":
        size = n // num_clients
        if size < max(1, cfg.min_size):
            raise DataError(
                f"partition iid: {n} records give {size} per client for {num_clients} "
                f"clients; need at least {max(1, cfg.min_size)}"
            )
        perm = _rng(seed, _IID).permutation(n)
        return [perm[k * size : (k + 1) * size].tolist() for k in range(num_clients)]
    if cfg.scheme == "by_field":
        return _by_field(records, num_clients, cfg, seed)
    return _dirichlet(records, num_clients, cfg, seed, labels)


def field_value(record: dict[str, Any], field: str) -> Any:
    """``record[field]``, else the source field kept in its ``extra``; a record without
    it raises :class:`DataError` naming the field and the record."""
    if field in record and field != "extra":
        return record[field]
    extra = record.get("extra") or {}
    if field in extra:
        return extra[field]
    have = sorted([k for k in record if k != "extra"] + list(extra))
    raise DataError(f"partition by_field: record {record.get('id', '?')!r} has no field "
                    f"{field!r}; its fields: {have}")


def field_groups(records: list[dict[str, Any]], num_clients: int, field: str,
                 seed: int) -> list[list[Any]]:
    """The values of ``field`` each client gets (NaturalIdPartitioner, grouped).

    As many values as clients: client k gets the k-th value in sorted order.  More
    values than clients: the sorted values in a seeded order, cut into ``num_clients``
    consecutive groups whose numbers of values differ by at most one.
    """
    values = sorted({field_value(r, field) for r in records}, key=lambda v: (str(type(v)), v))
    if len(values) < num_clients:
        raise DataError(
            f"partition by_field: field {field!r} has {len(values)} distinct value(s) in "
            f"the private pool ({values[:10]}), fewer than num_clients={num_clients}; "
            "use fewer clients or another field")
    if len(values) == num_clients:
        return [[v] for v in values]
    order = _rng(seed, _BY_FIELD).permutation(len(values))
    return [[values[i] for i in chunk]
            for chunk in np.array_split(order, num_clients)]


def _by_field(records: list[dict[str, Any]], num_clients: int, cfg: PartitionConfig,
              seed: int) -> list[list[int]]:
    field = str(cfg.field)
    groups = field_groups(records, num_clients, field, seed)
    client_of = {v: k for k, group in enumerate(groups) for v in group}
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for i, r in enumerate(records):  # records keep the pool's order within a client
        parts[client_of[field_value(r, field)]].append(i)
    small = [k for k, p in enumerate(parts) if len(p) < max(1, cfg.min_size)]
    if small:
        raise DataError(
            f"partition by_field ({field!r}): client(s) {small} get fewer than "
            f"min_size={max(1, cfg.min_size)} records (sizes {[len(p) for p in parts]}); "
            "lower min_size or use fewer clients")
    return parts


def _dirichlet(
    records: list[dict[str, Any]],
    num_clients: int,
    cfg: PartitionConfig,
    seed: int,
    labels: list[Any] | None,
) -> list[list[int]]:
    if labels is None:
        if any("label" not in r for r in records):
            raise DataError(
                "partition dirichlet needs labels, but the records have no 'label' "
                "(a generation task?); use partition scheme 'iid' or pass labels="
            )
        labels = [r["label"] for r in records]
    if len(labels) != len(records):
        raise DataError(f"partition: {len(labels)} labels for {len(records)} records")
    classes = sorted(set(labels), key=lambda c: (str(type(c)), c))
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[c] for c in labels], dtype=np.int64)
    by_class = [np.flatnonzero(y == c) for c in range(len(classes))]
    rng = _rng(seed, _DIRICHLET)
    need = cfg.min_size
    sizes: list[int] = []
    for _ in range(MAX_DIRICHLET_TRIES):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, cfg.alpha))
            if not np.all(np.isfinite(p)) or p.sum() <= 0:
                p = np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].extend(chunk.tolist())
        sizes = [len(p) for p in parts]
        if min(sizes) >= need:
            return [rng.permutation(np.array(p, dtype=np.int64)).tolist() for p in parts]
    raise DataError(
        f"partition dirichlet(alpha={cfg.alpha}): no draw in {MAX_DIRICHLET_TRIES} tries "
        f"gave every one of {num_clients} clients at least min_size={need} of {len(records)} "
        f"records (last sizes {sizes}); raise alpha, lower min_size or use fewer clients"
    )


@dataclass
class FederatedData:
    """What a federation trains and evaluates on."""

    public: list[dict[str, Any]]
    private: list[list[dict[str, Any]]]
    test: list[dict[str, Any]]
    task: str
    label_names: list[str] | None
    # Prompt template to pass to the formatting functions (None: the task default).
    template: str | None = None
    name: str = ""
    # The server's own labelled records (data.split.server_size; empty by default).
    server: list[dict[str, Any]] = field(default_factory=list)
    # False: the public records carry no gold fields (data.public_labels: false, or
    # data.public_dataset); a method must not read a public label then.
    public_labels: bool = True
    # data.classes.draw: the permutation of the classes drawn for this fold (slot i is
    # class class_order[i]); None: the class indices are the classes.
    class_order: list[int] | None = None

    def sizes(self) -> dict[str, Any]:
        """Record counts, for logs (``server`` only when the server has records)."""
        out: dict[str, Any] = {"server": len(self.server)} if self.server else {}
        return {
            **out,
            "public": len(self.public),
            "private": [len(p) for p in self.private],
            "test": len(self.test),
        }


def oversample(records: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """``records`` plus repeats of its minority classes' records (drawn in a seeded
    order, cycling) so that every class present has as many records as the largest."""
    by_label: dict[Any, list[dict[str, Any]]] = {}
    for r in records:
        by_label.setdefault(r["label"], []).append(r)
    if len(by_label) < 2:
        return list(records)
    most = max(len(v) for v in by_label.values())
    rng = np.random.default_rng(seed)
    out = list(records)
    for label in sorted(by_label, key=str):
        group = by_label[label]
        order = rng.permutation(len(group))
        out += [group[order[i % len(group)]] for i in range(most - len(group))]
    return out


def client_splits(cfg: DataConfig, num_clients: int, seed: int) -> FederatedData:
    """Load, split, partition, filter and cap a run's data (deterministic for ``seed``).

    With scheme ``fedmkt`` and an ``iid`` partition, client k gets the k-th of the equal
    parts; otherwise the private pool is partitioned by :func:`partition`.  Then, in
    order: ``data.public_dataset`` replaces the public set, the class filters
    (``data.classes``, through the fold's drawn permutation with ``draw``) keep each
    part's records of their classes, the caps keep the first records of each (seeded
    random) list (``data.max_per_class`` first), ``data.require`` is checked
    (:func:`check_split`) and ``data.public_labels: false`` removes the public records'
    gold fields.
    """
    ds = load_dataset_records(cfg.dataset)
    splits = make_splits(ds, cfg.split, num_clients, seed)
    pool = splits["private_pool"]
    if cfg.split.scheme == "fedmkt" and cfg.partition.scheme == "iid":
        size = len(pool) // num_clients
        if size < max(1, cfg.partition.min_size):
            raise DataError(
                f"split fedmkt: {size} records per client; partition.min_size is "
                f"{cfg.partition.min_size}"
            )
        parts = [list(range(k * size, (k + 1) * size)) for k in range(num_clients)]
    else:
        parts = partition(pool, num_clients, cfg.partition, seed)
    private = [[pool[i] for i in idx] for idx in parts]
    server, public, test = splits["server"], splits["public"], splits["test"]
    if cfg.public_dataset is not None:
        public = load_public_texts(cfg.public_dataset, ds.task, ds.label_names, ds.template)
        order = _rng(seed, _PUBLIC_ORDER).permutation(len(public))
        public = [public[i] for i in order]
    order = class_draw(cfg, ds, seed)
    server, private, public, test = _filter_classes(cfg, ds, server, private, public, test,
                                                    order)
    if cfg.max_per_class is not None:
        if ds.task not in _FILTERABLE:
            raise DataError(f"data.max_per_class caps classes; {ds.name or 'the dataset'} is "
                            f"a {ds.task} task")
        server = _cap_per_class(server, cfg.max_per_class)
        private = [_cap_per_class(p, cfg.max_per_class) for p in private]
    private = [p[: cfg.max_private_per_client] for p in private]
    if cfg.oversample:
        if ds.task != "classification":
            raise DataError(f"data.oversample balances classes; {ds.name or 'the dataset'} is "
                            f"a {ds.task} task")
        private = [oversample(p, seed + k) for k, p in enumerate(private)]
    public = public[: cfg.max_public]
    public_labels = cfg.public_labels and cfg.public_dataset is None
    check_split(cfg, ds, server, private, public, test[: cfg.max_test], order)
    if not public_labels:
        public = without_labels(public)
    return FederatedData(
        public=public,
        private=private,
        test=test[: cfg.max_test],
        task=ds.task,
        label_names=ds.label_names,
        template=ds.template,
        name=ds.name,
        server=server,
        public_labels=public_labels,
        class_order=order,
    )


def _cap_per_class(records: list[dict[str, Any]], cap: int) -> list[dict[str, Any]]:
    """The first ``cap`` records of each class, in order."""
    seen: dict[Any, int] = {}
    out = []
    for r in records:
        k = seen.get(r.get("label"), 0)
        if k < cap:
            out.append(r)
        seen[r.get("label")] = k + 1
    return out


class SplitCheckError(DataError):
    """A precondition of ``data.require`` does not hold; the message names its key."""


def class_draw(cfg: DataConfig, ds: Dataset, seed: int) -> list[int] | None:
    """``data.classes.draw``: the permutation of the classes for this run's fold
    (``split.fold``, or with ``split.folds`` and no ``fold`` the seed; so every training
    seed of one fold draws the same), seeded by ``split.fold_seed``; None without ``draw``."""
    if not cfg.classes.draw:
        return None
    if ds.task != "classification" or not ds.label_names:
        raise DataError(f"data.classes.draw: draws text classes; {ds.name or 'the dataset'} "
                        f"is a {ds.task} task")
    fold = run_fold(cfg.split, seed)
    rng = np.random.default_rng([int(cfg.split.fold_seed) & 0xFFFFFFFF, _CLASS_DRAW,
                                 fold & 0xFFFFFFFF])
    return rng.permutation(len(ds.label_names)).tolist()


def side_classes(spec: Any, num_classes: int | None, key: str,
                 order: list[int] | None) -> list[int]:
    """The classes a class spec names: its indices, or with ``order`` (a drawn
    permutation) the classes in those slots."""
    slots = parse_class_spec(spec, num_classes, key)
    return [order[i] for i in slots] if order is not None else slots


def drawn_groups(groups: dict[str, Any] | None, order: list[int] | None
                 ) -> dict[str, Any] | None:
    """``eval.class_groups`` as class lists under a drawn permutation (``order``); the
    groups unchanged without one."""
    if not groups or order is None:
        return groups
    return {name: side_classes(spec, len(order), f"eval.class_groups.{name}", order)
            for name, spec in groups.items()}


def _per_class(records: list[dict[str, Any]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for r in records:
        if "label" in r:
            counts[r["label"]] = counts.get(r["label"], 0) + 1
    return counts


def check_split(cfg: DataConfig, ds: Dataset, server: list[dict[str, Any]],
                private: list[list[dict[str, Any]]], public: list[dict[str, Any]],
                test: list[dict[str, Any]], order: list[int] | None) -> None:
    """``data.require``: a :class:`SplitCheckError` naming the first precondition that
    fails (disjoint classes, then the test, public and per-class counts)."""
    req = cfg.require
    n = len(ds.label_names) if ds.label_names is not None else None
    every = list(range(n)) if n is not None else sorted(_per_class(
        server + public + test + [r for p in private for r in p]))
    srv = (side_classes(cfg.classes.server, n, "data.classes.server", order)
           if cfg.classes.server is not None else every)
    cli = (side_classes(cfg.classes.private, n, "data.classes.private", order)
           if cfg.classes.private is not None else every)
    pooled = [r for p in private for r in p]
    if req.disjoint:
        both = sorted(set(srv) & set(cli))
        if both:
            raise SplitCheckError(f"data.require.disjoint: the server's and the clients' "
                                  f"classes share {both}")
        seen = sorted(set(_per_class(server)) & set(_per_class(pooled)))
        if seen:
            raise SplitCheckError(f"data.require.disjoint: server and client records share "
                                  f"classes {seen}")
    for key, part, what in (("min_test", test, "the test set"),
                            ("min_public", public, "the public set")):
        need = getattr(req, key)
        if len(part) < need:
            raise SplitCheckError(f"data.require.{key}: {what} has {len(part)} records, "
                                  f"fewer than {need}")
    if req.min_per_class:
        for side, classes, records in (("server", srv, server), ("private", cli, pooled)):
            counts = _per_class(records)
            short = {c: counts.get(c, 0) for c in classes
                     if counts.get(c, 0) < req.min_per_class}
            if short:
                worst = sorted(short.items(), key=lambda kv: (kv[1], kv[0]))[:5]
                raise SplitCheckError(
                    f"data.require.min_per_class: {len(short)} of the {side} side's "
                    f"{len(classes)} classes have fewer than {req.min_per_class} records "
                    f"(class: records, fewest first: "
                    f"{', '.join(f'{c}: {k}' for c, k in worst)})")


_FILTERABLE = ("classification", "image_classification")


def _filter_classes(cfg: DataConfig, ds: Dataset, server: list[dict[str, Any]],
                    private: list[list[dict[str, Any]]], public: list[dict[str, Any]],
                    test: list[dict[str, Any]], order: list[int] | None = None
                    ) -> tuple[Any, ...]:
    """``data.classes``: each part keeps its records of the listed classes (the classes in
    those slots of ``order``, a drawn permutation), in order."""
    given = {k: v for k, v in cfg.classes.model_dump().items()
             if v is not None and k != "draw"}
    if not given:
        return server, private, public, test
    first = f"data.classes.{next(iter(given))}"
    if ds.task not in _FILTERABLE:
        raise DataError(f"{first}: class filters are for classification tasks; "
                        f"{ds.name or 'the dataset'} is a {ds.task} task")
    n = len(ds.label_names) if ds.label_names is not None else None

    def keep(part: str, records: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
        if part not in given:
            return records
        key = f"data.classes.{part}"
        return filter_classes(records, side_classes(given[part], n, key, order), key, what)

    if "server" in given and not server:
        raise DataError("data.classes.server: the server has no records of its own "
                        "(data.split.server_size is 0)")
    server = keep("server", server, "the server's part")
    private = [keep("private", p, f"client {k}'s private part") for k, p in enumerate(private)]
    public = keep("public", public, "the public set")
    test = keep("test", test, "the test set")
    return server, private, public, test


_SPLITS_CACHE: dict[tuple[str, int, int], FederatedData] = {}


def run_data(cfg: DataConfig, num_clients: int, seed: int) -> FederatedData:
    """:func:`client_splits`, computed once per process for a given data config.

    The records are shared between callers: treat them as read-only.
    """
    key = (cfg.model_dump_json(), num_clients, seed)
    if key not in _SPLITS_CACHE:
        if len(_SPLITS_CACHE) >= 4:
            _SPLITS_CACHE.pop(next(iter(_SPLITS_CACHE)))
        _SPLITS_CACHE[key] = client_splits(cfg, num_clients, seed)
    return _SPLITS_CACHE[key]
