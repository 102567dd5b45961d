"""FedSP: tunable soft prompts are the messengers (Dong et al., Findings of EMNLP 2023), and
its baselines FedPrompt and FedPrompt-Single.

``config.py`` (settings), ``training.py`` (the client phases, Eq. 2, the paper's
optimiser), ``aux_model.py`` (the auxiliary model on the wire and on a client's disk),
``algorithm.py`` (the server's round and the client handlers).

``method.py`` holds its :class:`~fedkt.methods.base.Method` objects, which
:data:`fedkt.config.method_catalog.BUILT_IN` names; this file imports nothing, so that a config
imports the package's ``config.py`` alone.
"""
