"""lm-evaluation-harness on a run's models (the optional extra ``fedkt[harness]``).

The papers report their numbers with EleutherAI's lm-evaluation-harness; this module
runs it on the models a fedkt run ends with, through lm-eval's Python API and the
model objects fedkt already holds (``HFLM(pretrained=model, tokenizer=...)``, adapter
applied): no second load, no model hub.

* :func:`run_harness` evaluates the server's model (``Server.server_model()``) and, if asked,
  every client's (``Method.behaviour.client_model``, read from ``RUN_DIR/clients/client_k/``)
  on lm-eval tasks, and writes ``RUN_DIR/harness/<participant>.json``;
* :func:`load_harness_results` reads those files back as
  ``{participant: {task: {metric: value}}}``;
* fedkt ships offline tasks for its vendored multiple-choice sets
  (``fedkt/eval/harness_tasks/``: ``fedkt_intent_recognition``, ``fedkt_social_iqa``),
  scored with the prompts and choices fedkt's own scorer uses, so their ``acc`` /
  ``acc_norm`` equal fedkt's ``accuracy`` / ``accuracy_norm`` on the same items
  (``tests/eval/test_harness.py``); and the papers' tasks ``fedkt_arc_easy``,
  ``fedkt_arc_challenge``, ``fedkt_commonsense_qa``: lm-eval's own ``arc_easy``,
  ``arc_challenge`` and ``commonsense_qa`` on the vendored files, which fedkt's built-in
  datasets of those names pose the same way (``tests/eval/test_harness_paper_tasks.py``).
  ``include`` folders add a user's own task YAMLs.

Used by ``fedkt eval RUN_DIR --harness TASK[,TASK]`` and, at the end of a run, by the
``eval.harness`` config key.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkt.tracking.folder import atomic_write

if TYPE_CHECKING:
    from fedkt.config import RunConfig
    from fedkt.methods.base import Server
    from fedkt.train.lm import LM

log = logging.getLogger("fedkt.harness")

HARNESS_DIR = "harness"
TASKS_DIR = Path(__file__).resolve().with_name("harness_tasks")
# The tasks fedkt ships (one YAML each in TASKS_DIR).
SHIPPED_TASKS = ("fedkt_intent_recognition", "fedkt_social_iqa", "fedkt_arc_easy",
                 "fedkt_arc_challenge", "fedkt_commonsense_qa")
INSTALL_HINT = 'pip install "fedkt[harness]"  (lm-eval==0.4.13 and accelerate)'


class HarnessError(ValueError):
    """lm-evaluation-harness cannot run as asked; the message says what to change."""


def require_lm_eval() -> Any:
    """The ``lm_eval`` module, or :class:`HarnessError` with the install command."""
    try:
        import lm_eval
    except ImportError as exc:
        raise HarnessError(f"lm-evaluation-harness is not installed ({exc}): {INSTALL_HINT}"
                           ) from None
    return lm_eval


def parse_tasks(spec: str | Sequence[str]) -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` -> ``["a", "b"]`` (at least one task)."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    tasks = [t.strip() for t in items if t and t.strip()]
    if not tasks:
        raise HarnessError("--harness / eval.harness: name at least one lm-eval task, e.g. "
                           f"{SHIPPED_TASKS[0]}")
    return tasks


def task_manager(tasks: Sequence[str], include: Sequence[str | Path] = ()) -> Any:
    """An lm-eval ``TaskManager`` that knows ``tasks``: fedkt's shipped tasks and the
    ``include`` folders, plus lm-eval's own tasks only when one of ``tasks`` is not among
    those (indexing lm-eval's ~200 task folders takes seconds; its tasks download data)."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR)]
    for folder in include:
        if not Path(folder).is_dir():
            raise HarnessError(f"--harness-include / eval.harness_include: {folder} is not a "
                               "folder of lm-eval task YAMLs")
        paths.append(str(Path(folder).resolve()))
    manager = TaskManager(include_path=paths, include_defaults=False)
    if all(manager.match_tasks([t]) for t in tasks):
        return manager
    manager = TaskManager(include_path=paths, include_defaults=True)
    unknown = [t for t in tasks if not manager.match_tasks([t])]
    if unknown:
        raise HarnessError(f"--harness / eval.harness: unknown lm-eval task(s) {unknown}; "
                           f"fedkt ships {', '.join(SHIPPED_TASKS)} (offline), lm-eval has "
                           "its own (`lm_eval ls tasks`), --harness-include DIR adds yours")
    return manager


@contextmanager
def _quiet_lm_eval(verbose: bool) -> Iterator[None]:
    """lm-eval logs a lot at INFO/WARNING (e.g. that ``pretrained`` is a model object)."""
    loggers = [logging.getLogger(n) for n in ("lm_eval", "lm-eval")]
    levels = [lg.level for lg in loggers]
    if not verbose:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def evaluate_lm_harness(
    lm: LM,
    tasks: Sequence[str],
    *,
    include: Sequence[str | Path] = (),
    limit: int | float | None = None,
    samples: dict[str, list[int]] | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    log_samples: bool = False,
    verbose: bool = False,
) -> dict[str, Any]:
    """lm-eval's ``simple_evaluate`` output for one fedkt model (its adapter applied).

    ``max_length``: lm-eval truncates context from the left to this many tokens, as
    fedkt's scorer does with ``data.max_length`` (None: the model's maximum).
    ``limit``: the first N documents of each task (a fraction if < 1), for quick looks;
    ``samples``: instead, the documents to evaluate by index, per task.
    The model's train/eval flags are put back afterwards; no global RNG is reseeded.
    """
    require_lm_eval()
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    manager = task_manager(tasks, include)
    model = lm.model
    modes = [(m, m.training) for m in model.modules()]
    try:
        with _quiet_lm_eval(verbose):
            hflm = HFLM(pretrained=model, tokenizer=lm.tokenizer, batch_size=batch_size,
                        max_length=max_length)
            out = simple_evaluate(model=hflm, tasks=list(tasks), task_manager=manager,
                                  limit=limit, samples=samples, log_samples=log_samples,
                                  random_seed=None,
                                  numpy_random_seed=None, torch_random_seed=None)
    finally:
        for module, training in modes:
            module.training = training
    if out is None:  # only on non-zero ranks of a distributed run
        raise HarnessError("lm-eval returned no results")
    return out


# --------------------------------------------------------------------------- run folders


def restore_server(cfg: RunConfig, run_dir: Path) -> tuple[Server, int]:
    """The run's server rebuilt with its last checkpoint loaded, and that round."""
    from fedkt.methods import get_method
    from fedkt.tracking.checkpoint import read_checkpoint
    from fedkt.tracking.folder import RunRecorder

    recorder = RunRecorder(run_dir, resume=True)
    done = recorder.last_complete_round()
    state = read_checkpoint(recorder.checkpoints, done, recorder.latest())[0] if done else None
    server = get_method(cfg.method.name).server(cfg, run_dir)
    server.setup()
    if state is not None:
        server.load_state_dict(state)
    return server, done


def client_model(cfg: RunConfig, cid: int, after_round: int) -> LM:
    """Client ``cid``'s model as its state folder holds it after ``after_round``."""
    from fedkt.methods import get_method
    from fedkt.methods.base import ClientContext
    from fedkt.runtime.base import default_state_root

    method = get_method(cfg.method.name)
    if method.behaviour.client_model is None:
        raise HarnessError(
            f"method {cfg.method.name!r} has no per-client model to evaluate: its clients keep "
            "no causal LM of their own on their disk (FedAvg-style clients end with the "
            "global model, which `fedkt eval RUN --harness TASK` evaluates as the server; "
            "encoder and vision methods have no causal LM)")
    state_dir = default_state_root(cfg) / f"client_{cid}"
    if not state_dir.is_dir():
        raise HarnessError(f"client {cid}: no state folder {state_dir} (clients of a `flower` "
                           "deployment keep theirs on their own machines)")
    ctx = ClientContext(cfg=cfg, cid=cid, rnd=after_round + 1, step=0, state_dir=state_dir)
    return method.behaviour.client_model(ctx)


def _json_default(value: Any) -> Any:
    from lm_eval.utils import handle_non_serializable

    return handle_non_serializable(value)


def save_results(run_dir: Path, participant: str, out: dict[str, Any], **meta: Any) -> Path:
    """Write ``RUN_DIR/harness/<participant>.json``: lm-eval's results, the task
    versions, configs and sample counts, and ``meta`` (round, tasks, limit, ...)."""
    lm_eval = require_lm_eval()
    folder = Path(run_dir) / HARNESS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = {"participant": participant, **meta,
              "lm_eval_version": getattr(lm_eval, "__version__", None),
              **{k: out.get(k) for k in ("results", "versions", "n-shot", "n-samples",
                                         "higher_is_better", "configs")}}
    path = folder / f"{participant}.json"
    atomic_write(path, json.dumps(record, indent=2, default=_json_default) + "\n")
    return path


def run_harness(
    cfg: RunConfig,
    run_dir: Path,
    tasks: str | Sequence[str],
    *,
    server: Server | None = None,
    after_round: int | None = None,
    clients: bool = False,
    include: Sequence[str | Path] = (),
    limit: int | float | None = None,
    verbose: bool = False,
) -> dict[str, dict[str, dict[str, float]]]:
    """Evaluate the server's model (and with ``clients`` every client's) on ``tasks``.

    ``server``: a server already holding its final state (the runner's); None rebuilds
    it from the run's last checkpoint.  Writes ``RUN_DIR/harness/<participant>.json``
    and returns ``{participant: {task: {metric: value}}}`` of this call.
    """
    require_lm_eval()
    tasks = parse_tasks(tasks)
    run_dir = Path(run_dir)
    if server is None:
        server, after_round = restore_server(cfg, run_dir)
    elif after_round is None:
        from fedkt.tracking.folder import RunRecorder

        after_round = RunRecorder(run_dir, resume=True).last_complete_round()
    if limit is not None and limit >= 1:
        limit = int(limit)  # lm-eval: an int is a count, a float < 1 a fraction
    settings = dict(include=include, limit=limit, batch_size=cfg.eval.batch_size,
                    max_length=cfg.data.max_length, verbose=verbose)
    meta = dict(round=after_round, method=cfg.method.name, tasks=tasks, limit=limit)
    models: list[tuple[str, Any]] = []
    lm = server.server_model()
    if lm is not None:
        models.append(("server", lambda: server.server_model()))
    elif not clients:
        raise HarnessError(f"method {cfg.method.name!r} has no server model to evaluate; "
                           "--clients (eval.harness_clients: true) evaluates the clients'")
    if clients:
        models += [(f"client_{cid}", lambda cid=cid: client_model(cfg, cid, after_round))
                   for cid in cfg.client_ids()]
    written: dict[str, Path] = {}
    for participant, get in models:
        out = evaluate_lm_harness(get(), tasks, **settings)  # load each just before use:
        written[participant] = save_results(run_dir, participant, out, **meta)  # LMs share
    return {p: _metrics(json.loads(path.read_text())) for p, path in written.items()}


def run_after_job(cfg: RunConfig, run_dir: Path, server: Server, *, quiet: bool = False
                  ) -> dict[str, dict[str, dict[str, float]]]:
    """The ``eval.harness`` keys at the end of a run (``fedkt.runtime.job.run_job``)."""
    e = cfg.eval
    results = run_harness(cfg, run_dir, e.harness, server=server, clients=e.harness_clients,
                          include=[e.harness_include] if e.harness_include else (),
                          limit=e.harness_limit)
    if not quiet:
        print(format_results(results), flush=True)
    return results


def format_results(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """One line per participant, task and metric (stderrs next to their metric)."""
    lines = ["lm-evaluation-harness:"]
    for participant, tasks in results.items():
        for task, metrics in tasks.items():
            for name, value in metrics.items():
                if name.endswith("_stderr") or name == "sample_len":
                    continue
                err = metrics.get(f"{name}_stderr")
                lines.append(f"  {participant:>10} {task:<28} {name:<10} {value:.4f}"
                             + (f" ± {err:.4f}" if err is not None else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------- results


def _metrics(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """lm-eval's ``{"task": {"acc,none": .5, "alias": ...}}`` -> ``{"task": {"acc": .5}}``.

    The filter suffix ``,none`` is dropped (other filters stay: ``exact_match,strict``);
    entries that are not finite numbers (aliases, ``"N/A"`` stderrs) are left out.
    """
    out: dict[str, dict[str, float]] = {}
    for task, values in (record.get("results") or {}).items():
        metrics = {}
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value):
                continue
            name, _, flt = key.partition(",")
            metrics[name if flt in ("", "none") else key] = float(value)
        out[task] = metrics
    return out


def load_harness_results(run_dir: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """``{participant: {task: {metric: value}}}`` from ``RUN_DIR/harness/*.json``
    (empty when the run has none).  Metrics are lm-eval's names: ``acc``, ``acc_norm``,
    ``acc_stderr``, ...  Needs no lm-eval install."""
    folder = Path(run_dir) / HARNESS_DIR
    out: dict[str, dict[str, dict[str, float]]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise HarnessError(f"{path}: not a readable harness results file ({exc})") from None
        if not isinstance(record, dict) or not isinstance(record.get("results"), dict):
            raise HarnessError(f"{path}: no 'results' mapping (not written by fedkt eval "
                               "--harness)")
        out[str(record.get("participant") or path.stem)] = _metrics(record)
    return out
