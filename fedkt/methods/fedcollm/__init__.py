"""FedCoLLM: FedAvg of the clients' SLM adapter, then co-tuning of the server's LLM and the
global SLM by mutual distillation (Fan et al., arXiv:2411.11707).

``config.py`` (settings), ``cotune.py`` (Eqs. 4-6, the server's co-tuning), ``algorithm.py``
(the server's round; the clients run FedAvg's ``train`` handler).

``method.py`` holds its :class:`~fedkt.methods.base.Method` objects, which
:data:`fedkt.config.method_catalog.BUILT_IN` names; this file imports nothing, so that a config
imports the package's ``config.py`` alone.
"""
