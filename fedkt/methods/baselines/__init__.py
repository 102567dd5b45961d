"""The baselines the papers compare against, over model families (:mod:`.families`).

``algorithm.py``: zero-shot, standalone and centralized for any family (causal LMs,
encoder classifiers); ``fedavg_encoder.py`` and ``fedavg_vision.py``: FedAvg of an
encoder (FedKD's exchange) and of an image classifier (KOALA's baseline).  FedAvg of a
causal LM's adapter is its own package, :mod:`fedkt.methods.fedavg`.

``method.py`` holds its :class:`~fedkt.methods.base.Method` objects, which
:data:`fedkt.config.method_catalog.BUILT_IN` names; this file imports nothing, so that a config
imports the package's ``config.py`` alone.
"""
