"""FedMKT: mutual knowledge transfer between a server LLM and heterogeneous client SLMs by
top-K logits on a public set (Fan et al., COLING 2025), and its LLM2SLM baseline.

``config.py`` (settings), ``algorithm.py`` (the server's round and the client handlers),
``knowledge.py`` (what a participant computes, sends and learns from: one interface, top-K
logits or choice posteriors), ``distill.py`` (Algorithm 2, Eqs. 5-10).  Knowledge sets,
token alignment and targets are shared pieces in :mod:`fedkt.alignment`.

``method.py`` holds its :class:`~fedkt.methods.base.Method` objects, which
:data:`fedkt.config.method_catalog.BUILT_IN` names; this file imports nothing, so that a config
imports the package's ``config.py`` alone.
"""
