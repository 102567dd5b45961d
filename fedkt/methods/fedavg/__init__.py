"""FedAvg of PEFT adapters on one shared client model (McMahan et al., 2017).

The template of a method package: ``config.py`` (its settings, torch-free), ``algorithm.py``
(the server's round and the client handlers, read top to bottom) and ``method.py`` (its
:class:`~fedkt.methods.base.Method`). A copy becomes a method by its line in
:data:`fedkt.config.method_catalog.BUILT_IN` (or, outside fedkt, by
:func:`fedkt.methods.register_method`); this file imports nothing, so that a config
imports ``config.py`` alone.
"""
