"""The ``data`` section: the dataset, its split into public / private / test sets, the
partition among clients and the class filters (with the class-spec syntax ``eval`` shares)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fedkt.config.base import _Strict
from fedkt.config.bounds import MAX_COUNT, MAX_TOKENS, Count, Seed
from fedkt.infra.templates import HARD_MAX_WIDTH, check_template

__all__ = ["ClassFilterConfig", "ClassSpec", "DataConfig", "DatasetConfig", "PartitionConfig",
           "RequireConfig", "SplitConfig"]


ClassSpec = int | str | list[int]


class DatasetConfig(_Strict):
    """Where records come from and how their fields map onto fedkt's."""

    name: str | None = Field(None, description=(
        "A built-in vendored dataset (`fedkt list` shows them); give one of name, path or "
        "hf_name."))
    path: str | None = Field(None, description=(
        "A local file of records (jsonl/json/csv, or a suffix register_reader adds) or a folder "
        "of them."))
    hf_name: str | None = Field(None, description=(
        "A Hugging Face `datasets` id (loaded with datasets.load_dataset)."))
    hf_subset: str | None = Field(None, description=(
        "The Hugging Face dataset's subset (configuration) name."))
    hf_split: str = Field("train", description="The Hugging Face dataset's split to read.")
    task: Literal["multiple_choice", "classification", "generation",
                  "image_classification"] | None = Field(
        None, description=(
        "What the records are for; None: the built-in dataset's own task, else inferred from the "
        "fields."))
    fields: dict[str, str] = Field(default_factory=dict, description=(
        'fedkt field -> field in the records, e.g. {"text": "tweet", "label": "y"}.'))
    label_names: list[str] | None = Field(None, description=(
        "Classification: the class names, in label order (prompts and choices read them); None: "
        "the dataset's own."))
    template: str | None = Field(None, description=(
        "Optional prompt template, with {field} placeholders."))
    max_records: Count | None = Field(None, description=(
        "Read at most this many records (None: all)."))
    classes: ClassSpec | None = Field(None, description=(
        "Classification: keep only the records of these classes, which become the task's "
        "classes, renumbered 0..k-1 in the order given (only their names are choices); e.g. "
        "CLINC150's banking and credit-card domains, \"0-29\". None: every class."))

    @field_validator("template")
    @classmethod
    def _safe_template(cls, value: str | None) -> str | None:
        if value is not None:
            check_template(value)  # plain {field} names; widths within the hard limit
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DatasetConfig:
        given = [k for k in ("name", "path", "hf_name") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of 'name' (built-in dataset), 'path' (local file) or "
                f"'hf_name' (Hugging Face dataset); got {given or 'none'}"
            )
        _check_class_spec(self.classes, "dataset.classes")
        return self


class SplitConfig(_Strict):
    """How records become public / private / test sets.

    ``fedmkt``: the train part is cut into ``num_clients + 1`` equal parts, one
    public and the rest private (FedMKT paper, Sec. 5.1).  ``holdout``: a
    ``public_fraction`` of the train part is public, the rest private.
    """

    scheme: Literal["fedmkt", "holdout"] = Field("holdout", description=(
        "fedmkt: the train part cut into num_clients + 1 equal parts, the first public; holdout: "
        "public_fraction of it public, the rest private."))
    test_size: int | float = Field(0.2, gt=0, le=MAX_COUNT, description=(
        "The test holdout: a count of records, or a fraction (< 1) of them (ignored with "
        "test_dataset)."))
    public_fraction: float = Field(0.0, ge=0.0, lt=1.0, description=(
        "scheme holdout: the share of the training records that is the public set."))
    server_size: int | float = Field(0, ge=0, le=MAX_COUNT, description=(
        "The server's own labelled records (FederatedData.server): a count, or a fraction in (0, "
        "1) of the training records (what the test holdout leaves), cut after the test set and "
        "before the scheme's public / private parts (0: none; the splits are then unchanged)."))
    test_dataset: DatasetConfig | None = Field(None, description=(
        "Optional: the test set comes from another dataset (e.g. a dedicated test file)."))
    folds: int | None = Field(None, ge=2, le=1000, description=(
        "Cross-fitted folds: the records are cut once into this many folds (fold_seed), and a "
        "run with seed k tests on fold k and trains on the rest, so over seeds 0..folds-1 "
        "every record is tested exactly once and never in the training part of its own fold "
        "(test_size is then not used; seeds must be 0..folds-1 unless fold is set). None: a "
        "seeded holdout."))
    fold_seed: Seed = Field(0, description=(
        "folds: the seed of the one cut into folds, shared by every seed (fold) of a suite."))
    fold: int | None = Field(None, ge=0, le=999, description=(
        "folds: the fold this run tests (0..folds-1). None: the run's seed, as before; set, "
        "the seed is free to be a training seed (initialisation and data order) of its own, "
        "so a suite can run several seeds inside one fold (a suite's seeds_per_fold)."))

    @model_validator(mode="after")
    def _folds_or_test_dataset(self) -> SplitConfig:
        if self.fold is not None and self.folds is None:
            raise ValueError("fold: names a test fold, but folds is not set")
        if self.fold is not None and self.folds is not None and self.fold >= self.folds:
            raise ValueError(f"fold: {self.fold} does not exist (folds is {self.folds}: "
                             f"0..{self.folds - 1})")
        if self.folds is not None and self.test_dataset is not None:
            raise ValueError("folds: the test set comes from split.test_dataset, so there is "
                             "nothing to cut into test folds; set one of folds or test_dataset")
        return self


class PartitionConfig(_Strict):
    """How the private pool is divided among clients.

    ``iid``: equal random parts.  ``dirichlet``: label shares per client drawn from
    Dirichlet(``alpha``).  ``by_field``: by a natural key such as a user or speaker,
    flwr-datasets' ``NaturalIdPartitioner``: one client per value of ``field``, or, with
    more values than clients, the values (in a seeded order) dealt into ``num_clients``
    groups of as equal a number of values as can be.
    """

    scheme: Literal["iid", "dirichlet", "by_field"] = Field("iid", description=(
        "iid: equal random parts; dirichlet: label shares per client from Dirichlet(alpha); "
        "by_field: one client (or group) per value of field."))
    alpha: float = Field(1.0, gt=0, le=1e6, description=(
        "scheme dirichlet: the concentration; smaller is more skewed."))
    min_size: int = Field(1, ge=0, le=MAX_COUNT, description=(
        "The fewest private records a client may get (dirichlet redraws, others refuse to run "
        "below it)."))
    field: str | None = Field(None, min_length=1, description=(
        "scheme by_field: the record field whose values name the clients (a fedkt field such as "
        "``label``, or a source field kept in the record's ``extra``, e.g. ``topic``)."))

    @model_validator(mode="after")
    def _field_for_by_field(self) -> PartitionConfig:
        if self.scheme == "by_field" and self.field is None:
            raise ValueError("field: scheme by_field needs the record field to partition "
                             "by (e.g. field: topic)")
        if self.scheme != "by_field" and self.field is not None:
            raise ValueError(f"field: only scheme by_field reads it (scheme is "
                             f"{self.scheme!r})")
        return self


# A class filter: "0-2", "3,4,5,6", "0-2,7", a list of class indices, or one index.
_CLASS_SPEC = re.compile(r"\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*")


def _check_class_spec(spec: ClassSpec | None, key: str) -> None:
    """Syntax of a class filter (the range is checked against the task's classes on load)."""
    if spec is None:
        return
    if isinstance(spec, str):
        if not _CLASS_SPEC.fullmatch(spec):
            raise ValueError(f"{key}: expected class indices like '0-2', '3,4,5,6' or a list "
                             f"of integers, got {spec!r}")
        return
    items = [spec] if isinstance(spec, int) else spec
    if not items or any(c < 0 for c in items) or len(set(items)) != len(items):
        raise ValueError(f"{key}: expected distinct class indices >= 0, got {spec!r}")


class ClassFilterConfig(_Strict):
    """Text (and image) classification: the classes each part keeps (None: all).

    Applied after the split and partition, in order: every part keeps its records of
    the listed classes (labels are not renumbered), then the caps apply.  With ``draw``,
    the indices name slots of a seeded permutation of the classes, drawn again for each
    fold, so each fold puts other classes on each side.
    """

    server: ClassSpec | None = Field(None, description=(
        "The server's own labelled records (data.split.server_size)."))
    private: ClassSpec | None = Field(None, description="Each client's private records.")
    public: ClassSpec | None = Field(None, description=(
        "The public set (before its labels are withheld; not with data.public_dataset)."))
    test: ClassSpec | None = Field(None, description="The test set.")
    draw: bool = Field(False, description=(
        "Text classification: the class indices above (and eval.class_groups') name slots of a "
        "seeded permutation of the classes, not the classes: slot i is the i-th class of the "
        "permutation drawn for the fold (split.fold_seed and the fold; without folds, the run's "
        "seed), so every fold re-draws which classes go to which side. False: the indices are "
        "the classes."))

    @model_validator(mode="after")
    def _specs(self) -> ClassFilterConfig:
        for key in ("server", "private", "public", "test"):
            _check_class_spec(getattr(self, key), key)
        return self


class RequireConfig(_Strict):
    """Preconditions of a split, checked when a run's data is built (and by ``fedkt data``):
    one that fails raises a ``SplitCheckError`` naming its key, before any training."""

    disjoint: bool = Field(False, description=(
        "The server's and the clients' classes (data.classes.server, data.classes.private, both "
        "required) share none, and no server record has a class of a client record."))
    min_test: int = Field(0, ge=0, le=MAX_COUNT, description="The fewest test records.")
    min_public: int = Field(0, ge=0, le=MAX_COUNT, description="The fewest public records.")
    min_per_class: int = Field(0, ge=0, le=MAX_COUNT, description=(
        "The fewest labelled records of each of a side's classes: the server's records for each "
        "class of data.classes.server, all clients' private records together for each class of "
        "data.classes.private (each side's classes: every class when it has no filter)."))


class DataConfig(_Strict):
    dataset: DatasetConfig = Field(description=(
        "The task's records: a built-in dataset, a local file or a Hugging Face dataset, and its "
        "field mapping."))
    split: SplitConfig = Field(default_factory=SplitConfig, description=(
        "How the records become the public, private and test sets."))
    partition: PartitionConfig = Field(default_factory=PartitionConfig, description=(
        "How the private records are divided among the clients."))
    max_length: int = Field(256, ge=8, le=MAX_TOKENS, description=(
        "The most tokens of one example (prompt and answer); longer ones are cut."))
    max_private_per_client: Count | None = Field(None, description=(
        "Cap on each client's private records, for quick runs (None: all)."))
    max_per_class: Count | None = Field(None, description=(
        "Classification: cap on each class's records in the server's part and in each client's "
        "private part (the first ones of the class in the part's seeded order), after the class "
        "filters and before max_private_per_client (None: all)."))
    max_public: Count | None = Field(None, description=(
        "Cap on the public set's records (None: all)."))
    max_test: Count | None = Field(None, description=(
        "Cap on the test set's records (None: all)."))
    oversample: bool = Field(False, description=(
        "Classification: repeat each client's minority-class records (seeded) until its classes "
        "are as frequent as its largest one, after the cap (FedKD's positive oversampling on "
        "SMM4H). Examples per round grow accordingly."))
    public_labels: bool = Field(True, description=(
        "false: the public records reach every side without their gold fields (label; target and "
        "references), FederatedData.public_labels is false; test and private records keep theirs. "
        "Methods refuse the steps that would read a public label."))
    public_dataset: DatasetConfig | None = Field(None, description=(
        "An off-distribution public set: unlabelled text from another dataset, its fields mapped "
        "onto the task's input fields (fields: {text: prompt} puts DialogSum's dialogues in an "
        "intent task's text), shuffled (seeded) and capped by max_public. Needs public_labels: "
        "false. The task's own public part (split.public_fraction, scheme fedmkt's first fifth) "
        "is still cut, and goes unused."))
    classes: ClassFilterConfig = Field(default_factory=ClassFilterConfig, description=(
        "Classification: the classes each part keeps (None: all), applied after the split and "
        "partition."))
    require: RequireConfig = Field(default_factory=RequireConfig, description=(
        "Preconditions of the split (disjoint classes, the fewest test, public and per-class "
        "records); a failed one stops the run before any training, naming its key."))
    template_max_width: int = Field(1000, ge=1, le=HARD_MAX_WIDTH, description=(
        "The widest a template may pad a field, and its largest precision ({text:>80} is 80): a "
        "template cannot make one prompt of millions of characters."))

    chat_template: str = Field("none", min_length=1, description=(
        "Chat models: none (plain prompts), auto (each model's own chat template wraps the prompt "
        "as a user turn, for training and scoring; plain for a model without one), or a Jinja "
        "chat template used for every model (docs/data.md, chat templates)."))

    @model_validator(mode="after")
    def _public_source(self) -> DataConfig:
        if self.public_dataset is not None and self.public_labels:
            raise ValueError("public_dataset: an off-distribution public set has no labels; "
                             "set data.public_labels: false")
        if self.public_dataset is not None and self.classes.public is not None:
            raise ValueError("classes.public: data.public_dataset has no labels to filter by; "
                             "remove classes.public")
        if self.require.disjoint and (self.classes.server is None
                                      or self.classes.private is None):
            missing = "server" if self.classes.server is None else "private"
            raise ValueError(f"require.disjoint: compares data.classes.server with "
                             f"data.classes.private; give classes.{missing}")
        return self

    @model_validator(mode="after")
    def _template_widths(self) -> DataConfig:
        for key, ds in (("dataset", self.dataset), ("split.test_dataset", self.split.test_dataset)):
            if ds is not None and ds.template is not None:
                try:
                    check_template(ds.template, self.template_max_width)
                except ValueError as exc:
                    raise ValueError(f"{key}.template: {exc}") from None
        return self

    @field_validator("chat_template")
    @classmethod
    def _jinja_compiles(cls, value: str) -> str:
        if value in ("auto", "none"):
            return value
        if "{{" not in value and "{%" not in value:
            raise ValueError("expected auto, none or a Jinja chat template (with {{ }} or "
                             f"{{% %}}), got {value[:40]!r}")
        from jinja2 import Environment, TemplateSyntaxError

        try:
            Environment().parse(value)
        except TemplateSyntaxError as exc:
            raise ValueError(f"the Jinja template does not compile: {exc}") from None
        return value
