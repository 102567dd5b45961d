"""FedMKT's settings, and those of its LLM2SLM baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, model_validator

from fedkt.config.bounds import Epochs, LearningRate, Temperature, TopK
from fedkt.config.method_schema import MethodConfig
from fedkt.config.method_settings import ReceivingOptions, check_rehearsal

# A sender of knowledge: the server (its LLM) or the clients.
Side = Literal["clients", "server"]

if TYPE_CHECKING:
    from fedkt.config import RunConfig


class FedMKTConfig(MethodConfig):
    """FedMKT hyper-parameters.

    Paper defaults live in ``training`` (LoRA r=8, alpha=16, dropout 0.05; AdamW betas
    (0.9, 0.95), weight decay 0.1, warm-up 0.008, max grad norm 1.0, batch 4, one local
    epoch); the method's own are below.
    """

    name: Literal["fedmkt"] = "fedmkt"
    ft_weight: float = Field(0.9, ge=0.0, le=1.0, description=(
        "lambda of Eqs. 9-10: the weight of the fine-tuning loss L_FT; L_KD gets 1 - lambda."))
    top_k: TopK = Field(128, description=(
        "Logits kept per position in S_k and S_0 (FATE-LLM's top_k_logits_keep)."))
    temperature: Temperature = Field(1.0, description=(
        "Softmax temperature of L_KD, on both sides' logits or choice posteriors (no T**2 "
        "factor, as the paper's T = 1 needs none; receiving.t_squared adds it)."))
    server_kd_epochs: Epochs = Field(1.0, description=(
        "Passes over D_p per round in the server's step 5 (the LLM's distillation)."))
    client_kd_epochs: Epochs = Field(1.0, description=(
        "Passes over D_p per round in each client's step 7 (distillation)."))
    client_kd: bool = Field(True, description=(
        "False (an extension, for a control of clients -> LLM whose clients no claim reads): "
        "steps 6-7 are skipped, the LLM sends no S_0 and each client is evaluated with its "
        "model of step 1, as under teacher: none (client_kd_epochs and client_kd_lr go "
        "unused). Steps 6-7 come after the LLM's last change of a round, so in a one-round "
        "run the LLM's numbers are those of the same arm with them."))
    client_kd_lr: LearningRate | None = Field(None, description=(
        "Learning rate of step 7 only (None: the client model's, clients.models[i].lr, else "
        "training.lr). The LLM's rate is server.lr (D.1), the SLMs' clients.models[i].lr."))
    llm_training: bool = Field(True, description=(
        "False: LLM2SLM, the LLM is frozen and only transfers knowledge to the SLMs."))
    selection_loss: Literal["mean", "sum"] = Field("mean", description=(
        'Per-sample loss DualMinCE compares: mean CE over the target tokens ("mean", as the paper '
        "and FATE-LLM) or their sum, the negative log-likelihood of the target text, which does "
        'not depend on how finely a tokenizer cuts it ("sum").'))
    fallback_to_own: bool = Field(False, description=(
        "Where no other model beats this model's own loss: leave the sample out of L_KD (False: "
        "Algorithm 2, S~ holds only samples where the other model's loss is lower) or distil "
        "towards the model's own top-K (True: FATE-LLM's choice, an extension)."))
    unaligned: Literal["one_hot", "own", "skip"] = Field("one_hot", description=(
        "A position of a selected sample with no aligned teacher position gets a one-hot target "
        "on the ground-truth next token (\"one_hot\", Appendix B 3(d)), the model's own top-K "
        '("own", an extension) or no distillation ("skip").'))
    kd_positions: Literal["all", "target"] = Field("all", description=(
        'Positions L_KD covers: every position that predicts a real token ("all") or only those '
        'predicting target tokens ("target", like L_FT). "all" is the paper\'s reading: its '
        "knowledge set holds the logits of every token of a public text (Appendix B aligns every "
        "token; Appendix C counts N x S x K logits, S the text length), and L_KD (Eqs. 7-8) is "
        "the CE against them over S~ with no position left out; FATE-LLM's FedMKT averages it "
        "over every non-padding position (the attention mask)."))
    post_fedavg: bool = Field(False, description=(
        "Homogeneous setting only: FedAvg of the client adapters after step 7."))
    knowledge: Literal["logits", "choices"] = Field("logits", description=(
        "What a model's knowledge of a public sample is: \"logits\", the top-K logits of every "
        'position of the prompt and its gold answer (the paper); "choices", its posterior over '
        "the task's choices (fedkt.alignment.choices: an extension for classification and "
        "multiple-choice tasks that reads no public label and needs no token alignment)."))
    selection: Literal["dual_min_ce", "entropy", "always"] = Field("dual_min_ce", description=(
        'Which teacher a learner takes, per public sample: "dual_min_ce" (Algorithm 2: the other '
        "model with the smallest loss on the gold answer, if below the learner's own), \"entropy\" "
        "(the other model with the lowest entropy, if below the learner's own: DS-FL's rule, "
        'reads no label) or "always" (the mean of the other models). The last two are extensions '
        "and need knowledge: choices."))
    teacher: Literal["real", "shuffled", "marginal", "self", "none"] = Field("real", description=(
        'The controls for transfer (extensions): "real" (the paper); "shuffled", every sender '
        "permutes its knowledge across the public samples, afresh each round (the same bytes, "
        'marginals and entropies, no per-sample information); "marginal", every sender gives '
        "every public sample its mean posterior over them (the same bytes; the class marginal "
        'alone); "self", every learner distils towards its own knowledge (the same public steps '
        'and bytes; nothing comes from the other side); "none", no exchange: steps 2-7 are '
        "skipped (no knowledge computed or sent, no KD step; local training, the LLM's own-data "
        "epochs and evaluation as in every arm). All but real and none need knowledge: choices."))
    teacher_from: Literal["both", "clients", "server"] = Field("both", description=(
        "Whose knowledge a sender-side control (teacher: shuffled or marginal) replaces "
        '(an extension): "both", every sender\'s; "clients", only what the clients send (the '
        "control of clients -> LLM; the LLM's knowledge travels as it is); \"server\", only "
        "what the LLM sends (the control of LLM -> clients: the LLM first learns from the "
        "clients' real knowledge, as in the real arm, so a collapse of the LLM under a "
        'control teacher cannot stand in for the control of the other direction).'))
    receiving: ReceivingOptions = Field(default_factory=ReceivingOptions, description=(
        "How a learner takes in the other side's knowledge while keeping its own (rehearsal, "
        "anchoring, T**2, selective taking): extensions beyond the paper, each off by default "
        "(docs/methods/fedmkt.md, receiving-side options)."))

    renamed: ClassVar[dict[str, str]] = {"lam": "ft_weight"}

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, values: Any) -> Any:
        if isinstance(values, dict) and "server_lr" in values:
            raise ValueError("server_lr: the LLM's learning rate is now server.lr (a learning "
                             "rate per model, FedMKT D.1); remove method.server_lr")
        return values

    @model_validator(mode="after")
    def _knowledge_settings(self) -> FedMKTConfig:
        if self.knowledge == "logits":
            if self.selection != "dual_min_ce":
                raise ValueError(f"selection: {self.selection!r} compares posteriors over the "
                                 "task's choices; set knowledge: choices (or selection: "
                                 "dual_min_ce)")
            if self.teacher not in ("real", "none"):
                raise ValueError(f"teacher: {self.teacher!r} permutes or replaces knowledge per "
                                 "public sample, which needs knowledge: choices (top-K logits "
                                 "of samples of different lengths do not permute)")
        else:
            for key in _LOGITS_ONLY:  # set away from its default, it would be ignored
                if getattr(self, key) != type(self).model_fields[key].default:
                    raise ValueError(f"{key}: shapes distillation on top-K logits, and "
                                     "method.knowledge is 'choices' (posteriors over the task's "
                                     "choices); remove it or set knowledge: logits")
        if self.teacher_from != "both" and self.teacher not in ("shuffled", "marginal"):
            raise ValueError(f"teacher_from: {self.teacher_from!r} says whose knowledge the "
                             "shuffled or marginal control replaces; with teacher: "
                             f"{self.teacher!r} it would be ignored (remove it, or set "
                             "teacher: shuffled or marginal)")
        if self.teacher_from == "clients" and not self.llm_training:
            raise ValueError("teacher_from: 'clients': with llm_training: false (as under "
                             "llm2slm the clients send the LLM nothing) a control of what they "
                             "send would change nothing; use teacher_from: server (or both)")
        if not self.client_kd and not self.llm_training:
            raise ValueError("client_kd: false: with llm_training: false (as under llm2slm) "
                             "the LLM learns nothing either, so nothing would transfer; set "
                             "one of them true")
        if not self.client_kd and self.post_fedavg:
            raise ValueError("client_kd: false: post_fedavg averages the client adapters after "
                             "step 7, which client_kd: false skips; remove one of them")
        self.receiving.check(self.knowledge, self.teacher)
        return self

    @property
    def sends_s0(self) -> bool:
        """Whether steps 6-7 run (the LLM sends S_0, each client distils it): not under
        ``teacher: none`` nor ``client_kd: false``."""
        return self.teacher != "none" and self.client_kd

    def controls(self, sender: Side) -> bool:
        """Whether ``teacher`` (a sender-side control) replaces what ``sender`` sends."""
        return self.teacher_from in ("both", sender)


# What only the top-K logits read (TopKKnowledge); top_k is not among them: base configs
# set it, and suites switch those to knowledge: choices (it is then unused, and harmless).
_LOGITS_ONLY = ("selection_loss", "fallback_to_own", "unaligned", "kd_positions")


def check_config(cfg: RunConfig) -> None:
    """Refuse every path that would read a gold label of the public set when
    ``data.public_labels`` is false (the label-free setting, an extension)."""
    m = cfg.method
    check_rehearsal(cfg, llm_receives=m.llm_training)
    if cfg.data.public_labels:
        return
    reasons = []
    if m.ft_weight > 0:
        reasons.append(f"method.ft_weight is {m.ft_weight}: L_FT on the public set (Eqs. 5-6) "
                       "reads its labels; set ft_weight: 0")
    if m.knowledge == "logits":
        reasons.append("method.knowledge is 'logits': the top-K logits are taken by teacher "
                       "forcing on the gold answer; set knowledge: choices")
    if m.selection == "dual_min_ce":
        reasons.append("method.selection is 'dual_min_ce': DualMinCE compares gold losses; "
                       "set selection: entropy or always")
    if m.knowledge == "logits" and m.unaligned == "one_hot":
        reasons.append("method.unaligned is 'one_hot': a one-hot target on the gold token")
    if reasons:
        raise ValueError("data.public_labels is false, so no gold label of the public set may "
                         "be read: " + "; ".join(reasons))


class LLM2SLMConfig(FedMKTConfig):
    """The LLM2SLM baseline: FedMKT with the server LLM frozen (only LLM -> SLM)."""

    name: Literal["llm2slm"] = "llm2slm"  # type: ignore[assignment]
    llm_training: bool = False
