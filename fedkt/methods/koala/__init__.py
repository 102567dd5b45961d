"""KOALA: small models on resource-constrained clients, reverse and forward distillation
through the server's large model (Chen et al., arXiv:2407.05268).

``config.py`` (settings), ``losses.py`` (Eqs. 2-17), ``reductions.py`` (Table 2),
``algorithm.py`` (the server's round and the client handlers).

``method.py`` holds its :class:`~fedkt.methods.base.Method` objects, which
:data:`fedkt.config.method_catalog.BUILT_IN` names; this file imports nothing, so that a config
imports the package's ``config.py`` alone.
"""
