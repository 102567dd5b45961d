"""The ``tracking`` section: the experiment trackers (TensorBoard, MLflow) a run is
mirrored to."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from fedkt.config.base import _Strict

__all__ = ["TRACKING_BACKENDS", "MLflowSettings", "TensorBoardSettings", "TrackingConfig"]


# Tracking backends: the package each needs and the extra that installs it.
TRACKING_BACKENDS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "fedkt[tensorboard]"),
    "mlflow": ("mlflow", "fedkt[mlflow]"),
}


class MLflowSettings(_Strict):
    uri: str | None = Field(None, description=(
        "Tracking URI (a local folder, file:, sqlite:, http(s)://). None: $MLFLOW_TRACKING_URI, "
        "else a local file store beside the run folder (RUN_DIR/../mlruns; a suite: its folder)."))
    experiment: str | None = Field(None, description=(
        "Experiment the run is logged to. None: the run's name (a suite: the suite's name)."))


class TensorBoardSettings(_Strict):
    dir: str | None = Field(None, description=(
        "Folder of the event files. None: RUN_DIR/tensorboard (a suite: SUITE/tensorboard/ARM/ "
        "seed_N, so `tensorboard --logdir SUITE/tensorboard` shows every run)."))


class TrackingConfig(_Strict):
    """Experiment trackers that mirror the run: every metrics.jsonl row, the resolved
    config and the final summary (``tracking: [tensorboard, mlflow]`` is short for
    ``tracking: {backends: [...]}``; docs/evaluation.md)."""

    backends: list[Literal["tensorboard", "mlflow"]] = Field(default_factory=list, description=(
        'Backends to mirror to, each an optional extra (pip install "fedkt[mlflow]").'))
    run_name: str | None = Field(None, description=(
        "The tracking run's name. None: the run's name (a suite: ARM/seed_N)."))
    tags: dict[str, str] = Field(default_factory=dict, description=(
        "Tags of the tracking run (MLflow tags; a text entry in TensorBoard). A suite adds suite, "
        "arm and seed."))
    mlflow: MLflowSettings = Field(default_factory=MLflowSettings, description=(
        "MLflow's settings (backend mlflow)."))
    tensorboard: TensorBoardSettings = Field(default_factory=TensorBoardSettings, description=(
        "TensorBoard's settings (backend tensorboard)."))

    @model_validator(mode="before")
    @classmethod
    def _list_of_backends(cls, values: Any) -> Any:
        if isinstance(values, list | str):
            return {"backends": [values] if isinstance(values, str) else values}
        return values

    @field_validator("backends")
    @classmethod
    def _installed(cls, backends: list[str], info: ValidationInfo) -> list[str]:
        """Each backend's package must be importable where the run's server starts
        (clients never track: they skip this check)."""
        import importlib.util

        if len(set(backends)) != len(backends):
            raise ValueError(f"{backends} names a backend twice")
        if (info.context or {}).get("check_installed", True):
            for name in backends:
                module, extra = TRACKING_BACKENDS[name]
                if importlib.util.find_spec(module) is None:
                    raise ValueError(f"{name} is not installed: pip install \"{extra}\"")
        return backends
