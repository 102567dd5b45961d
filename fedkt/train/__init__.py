"""Training, for every method and model family: one optimiser, one step, one loop.

* :mod:`fedkt.train.optim`: AdamW with warm-up (:func:`make_optimizer`), the gradient step
  (:func:`step`: zero, backward, clip each group, step, schedule), :func:`grad_norm`;
* :mod:`fedkt.train.loop`: :func:`run_steps`, the loop every trainer below runs;
* :mod:`fedkt.train.lm`: causal LMs with PEFT adapters (:func:`train_lm`, :func:`evaluate_lm`);
* :mod:`fedkt.train.encoder`: text classifiers (:func:`train_encoder`, :func:`evaluate_encoder`);
* :mod:`fedkt.train.vision`: image classifiers (:func:`train_vision`, :func:`evaluate_vision`);
* :mod:`fedkt.train.pretrain`: a server's image backbone pretrained on class-disjoint data.

A method's own loop (FedCoLLM's co-tuning, FedKD's mutual distillation, FedSP's Eq. 2)
builds its batches and its loss, the paper's equations, and hands them to
:func:`~fedkt.train.loop.run_steps` with a :func:`~fedkt.train.optim.step`.
"""
