"""The built-in runtimes' own settings: each model is the config section
``runtime.<name with '-' as '_'>`` of the runtime that registers it
(:func:`fedkt.runtime.registry.register_runtime`); pydantic only, so validating a config
never imports a transport."""

from __future__ import annotations

from typing import Annotated, Literal

from annotated_types import Ge, Le
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["FlowerSettings", "FlowerSimSettings", "LocalSettings", "RuntimeSettings"]


# Every config model's settings (fedkt.config's too): unknown keys are refused, and a NaN
# or infinite number is never a meaningful setting.
STRICT = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(),
                    allow_inf_nan=False)


class RuntimeSettings(BaseModel):
    """Base of a runtime's settings section: unknown keys and NaN/inf are refused."""

    model_config = STRICT


class LocalSettings(RuntimeSettings):
    """``local``: where its clients run (in this process, or in worker processes)."""

    client_workers: int = Field(1, ge=1, le=1024, description=(
        "Clients that run at once, each in a worker process of its own (1: every client in "
        "this process, one after another); never more workers than clients. With "
        "client_threads (or runtime.torch_threads) set, the same numbers as 1 for a given "
        "seed; faster where one client cannot keep every core busy (two clients of a small "
        "model on two cores), slower for tiny models (a worker's start costs seconds), and "
        "one model copy per worker in memory."))
    client_threads: Annotated[int, Ge(1), Le(1024)] | Literal["auto"] = Field("auto", description=(
        "torch threads each client computes with, in a worker or in this process (this "
        "process's own count is restored after each client); runtime.torch_threads, when "
        "set, wins. auto: the physical cores (or $OMP_NUM_THREADS) shared out over the "
        "workers (all of them with 1 worker, half each with 2), so another client_workers gives other threads and, "
        "with bf16 kernels, other numbers; a number gives the same numbers with any "
        "client_workers."))


class FlowerSimSettings(RuntimeSettings):
    """``flower-sim``: resources per simulated client (a Ray actor each)."""

    client_cpus: float = Field(1.0, gt=0, le=1024, description=(
        "CPUs each simulated client (a Ray actor) reserves."))
    client_gpus: float = Field(0.0, ge=0, le=64, description=(
        "GPUs (or a fraction of one) each simulated client reserves."))


class FlowerSettings(RuntimeSettings):
    """``flower`` (deployment): how ``fedkt run`` reaches the SuperLink."""

    superlink: str = Field("127.0.0.1:9093", description=(
        "The SuperLink's control address used by ``fedkt run``."))
    federation: str | None = Field(None, description=(
        "The Flower federation the job runs on (None: the SuperLink's default)."))
    insecure: bool = Field(True, description=(
        "Plain HTTP to the SuperLink; false: TLS (see docs/deployment.md)."))
    root_certificates: str | None = Field(None, description=(
        "With insecure=false: CA certificate (PEM) that signed the SuperLink's certificate, e.g. "
        "ca.crt of `fedkt deploy certs` (None: the system's CAs)."))
