"""FedKD: local teachers, a shared student, adaptive mutual distillation, SVD-compressed
updates (Wu et al., Nature Communications 2022).

``config.py`` (settings), ``models.py`` (teacher, student, W_h), ``losses.py`` (Eqs. 1-7),
``algorithm.py`` (the server's round and the client handlers).

``method.py`` holds its :class:`~fedkt.methods.base.Method` objects, which
:data:`fedkt.config.method_catalog.BUILT_IN` names; this file imports nothing, so that a config
imports the package's ``config.py`` alone.
"""
