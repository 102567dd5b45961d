"""FedCoLLM: federated co-tuning of a server LLM and the clients' SLM (Fan et al., 2024).

Fan, Kang, Ma, Fan, Chen, Yang, "FedCoLLM: A Parameter-Efficient Federated Co-tuning
Framework for Large and Small Language Models", arXiv:2411.11707, Algorithm 1.

Clients share one small model g (the SLM) with a LoRA adapter theta; the server holds a
large model f (the LLM) with its own LoRA adapter omega and the auxiliary set D_a (the
``public`` split).  Steps are cited as "step N (Alg. 1 l. L)", by the numbered lines of
the paper's Algorithm 1.  Every round:

1. (Alg. 1 l. 11) the server sends the global adapter theta to the clients;
2. (Alg. 1 l. 12, 22-34) client k trains theta_k on its private data with the task loss
   (Eq. 3);
3. (Alg. 1 l. 13) the server averages theta = (1/K) sum_k theta_k (``weighted:
   true`` weights by example counts instead; with ``secure_aggregation.enabled`` it only
   learns the sum, by SecAgg+);
4. (Alg. 1 l. 14-20) on D_a the LLM and the global SLM co-tune by mutual distillation (Eqs. 4-6)::

       L^f = L_FT^f(omega) + lambda * L_KD^f,   L_KD^f = KL(g || f)   (LLM adapter omega)
       L^g = L_FT^g(theta) + lambda * L_KD^g,   L_KD^g = KL(f || g)   (SLM adapter theta)
       L_2 = L^f + L^g                                                 (Eq. 6)

   (lambda is ``method.kd_weight``.)  Each adapter descends its own loss (Alg. 1
   l. 16-17): omega by grad L^f and theta by grad L^g, with the other model's output a
   fixed (detached) target in each KD term, KL(target || student) as in FATE-LLM.
   ``cotune_gradients: joint`` instead back-propagates L^f + L^g with nothing detached,
   so each adapter also learns from the other's KD term (a symmetric KL at about twice
   the weight).  Two AdamW optimisers step
   omega and theta, each with its own learning rate (``llm_lr``, ``slm_lr``);
5. the distilled theta goes back to the clients in the next round (its step 1).

Controls (extensions, ``teacher``, with ``knowledge: choices`` but ``none``): each model's
target is the other's posteriors permuted across D_a (``shuffled``), their mean on every
sample (``marginal``) or its own (``self``); ``none`` skips step 4, so each round is
FedAvg and the LLM's own-data epochs alone.  The receiving-side options (``receiving``:
rehearsal, anchoring, T**2, selective taking) are :mod:`fedkt.alignment.receiving`'s.

The server row's ``train/loss`` is the clients' mean task loss of step 2 (the convention
of every method, docs/architecture.md); the co-tuning objectives are ``cotune_llm`` and
``cotune_slm``.

Steps 1-3 are FedAvg (:func:`fedkt.methods.fedavg.average_client_adapters`); step 4 is
:mod:`.cotune`.  When f and g share a tokenizer (the paper's setting) the KL terms
compare full next-token distributions position by position.  When they do not, both
sequences are aligned and each KL compares the teacher side's top-K distribution, mapped
into the other vocabulary by MinED, with the student side's full distribution
(:class:`~fedkt.methods.fedcollm.cotune.CrossTokenizerKL`, through
:class:`fedkt.alignment.bridge.TokenBridge`).
"""

from __future__ import annotations

from torch import Tensor

from fedkt.alignment.choices import require_choice_task
from fedkt.data.formatting import check_shared_template
from fedkt.errors import ConfigError
from fedkt.eval import predictions
from fedkt.federated.privacy import update_norm
from fedkt.methods.base import Clients, Server
from fedkt.methods.fedavg.algorithm import average_client_adapters
from fedkt.train.lm import LM, client_lm, evaluate_lm, server_lm, train_lm

from .config import FedCoLLMConfig
from .cotune import CrossTokenizerKL, cotune, cotune_choices, same_tokenizer


class FedCoLLMServer(Server[FedCoLLMConfig]):
    """Algorithm 1: FedAvg of the SLM adapter, then LLM <-> SLM co-tuning on D_a."""

    def setup(self) -> None:
        cfg = self.cfg
        models = {m.model_dump_json() for m in cfg.clients.models}
        if len(models) != 1:
            raise ConfigError("clients.models: fedcollm needs one SLM shared by all clients")
        if cfg.server is None:
            raise ConfigError("server: fedcollm needs a server LLM (server: {name: ...})")
        if cfg.server.model_dump_json() in models:
            raise ConfigError("server: fedcollm co-tunes a server LLM with the clients' SLM; "
                              "give the server a different (larger) model than clients.models")
        public = self.data().public
        if not public:
            raise ConfigError("data.split: fedcollm co-tunes on the auxiliary set D_a, the public "
                              "split, which is empty; set data.split.public_fraction > 0 (or "
                              "scheme: fedmkt)")
        self.llm = server_lm(cfg, self.data())
        self.slm = client_lm(cfg, 0, self.data())
        self.omega = self.llm.trainable()
        self.theta = self.slm.trainable()
        self.bridge = None
        if self.method.knowledge == "choices":  # no token alignment: each scores the choices
            require_choice_task(self.data().task)
        else:
            check_shared_template(cfg.data.chat_template,
                                  {"server": self.llm.tokenizer,
                                   "the clients' SLM": self.slm.tokenizer}, "fedcollm")
            if not same_tokenizer(self.llm.tokenizer, self.slm.tokenizer, cfg, public,
                                  data=self.data()):
                self.bridge = CrossTokenizerKL(self.llm.tokenizer, self.slm.tokenizer,
                                               self.method.top_k)

    def round(self, rnd: int, clients: Clients) -> dict[str, float]:
        sent = self.theta
        # steps 1-3 (Alg. 1 l. 11-13): broadcast theta; clients train theta_k (Eq. 3);
        # (secure) FedAvg into theta
        self.theta, metrics = average_client_adapters(self, clients, self.theta)
        averaged = self.theta
        if self.data().server:  # an extension: the LLM also learns the server's own data
            metrics.update(self.learn_own_data(rnd))
        # step 4 (Alg. 1 l. 14-20): co-tune LLM (omega) and global SLM (theta) on D_a
        # (Eqs. 4-6)
        llm, slm = self.llm.reset(self.omega), self.slm.reset(self.theta)
        if self.method.teacher == "none":  # the no-exchange control: no co-tuning
            stats = {"cotune_steps": 0}
        elif self.method.knowledge == "choices":  # an extension: KL over the task's choices
            stats = cotune_choices(self.cfg, llm, slm, self.data().public, data=self.data(),
                                   seed=self.seed(rnd, "cotune"), rehearse=self.data().server)
        else:
            stats = cotune(self.cfg, llm, slm, self.data().public, data=self.data(),
                           seed=self.seed(rnd, "cotune"), bridge=self.bridge)
        self.omega, self.theta = self.llm.trainable(), self.slm.trainable()
        # How far co-tuning moved theta, against how far the clients' round moved it.
        stats["theta_shift_local"] = update_norm({k: averaged[k] - sent[k] for k in sent})
        stats["theta_shift_cotune"] = update_norm({k: self.theta[k] - averaged[k]
                                                   for k in self.theta})
        # step 5: theta goes back to the clients at the start of the next round
        return {**metrics, **{f"train/{k}": v for k, v in stats.items()}}

    def learn_own_data(self, rnd: int) -> dict[str, float]:
        """An extension (``data.split.server_size``): the LLM trains on the server's own
        labelled data with the task loss before co-tuning, as clients do on theirs (Eq. 3)."""
        m: FedCoLLMConfig = self.method
        stats = train_lm(self.cfg, self.llm.reset(self.omega), self.data().server,
                         data=self.data(), seed=self.seed(rnd, "own"),
                         lr=m.llm_lr or self.cfg.training.lr,
                         desc="server train")
        self.omega = self.llm.trainable()
        return {"train/server_own_loss": stats["loss"]}

    def evaluate(self, rnd: int) -> dict[str, dict[str, float]]:
        """Two participants: ``server`` is the LLM (omega), ``global_slm`` the co-tuned
        global SLM (theta), which the clients receive next round."""
        test = self.data().test
        llm = evaluate_lm(self.cfg, self.llm.reset(self.omega), test, data=self.data())
        with predictions.scope("global_slm"):  # its own per-example table
            slm = evaluate_lm(self.cfg, self.slm.reset(self.theta), test, data=self.data())
        return {"server": llm, "global_slm": slm}

    def server_model(self) -> LM:
        """The LLM (omega); the global SLM is what every client holds."""
        return self.llm.reset(self.omega)

    def participant_model(self, participant: str) -> LM | None:
        """``server``: the LLM (omega); ``global_slm``: the co-tuned SLM (theta)."""
        if participant == "global_slm":
            return self.slm.reset(self.theta)
        return super().participant_model(participant)

    def state_dict(self) -> dict[str, Tensor]:
        return {**{f"llm.{k}": v for k, v in self.omega.items()},
                **{f"slm.{k}": v for k, v in self.theta.items()}}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        # In the models' parameter order (a checkpoint's is sorted), so that sums over the
        # adapters (the theta shifts) add in the same order as in an uninterrupted run.
        self.omega = {k: state[f"llm.{k}"] for k in self.llm.initial}
        self.theta = {k: state[f"slm.{k}"] for k in self.slm.initial}
