"""The run folder and what is made from it, one job per module.

* :mod:`~fedkt.tracking.rows`: metrics rows: what a key means (timings, metrics,
  bookkeeping), reading ``metrics.jsonl``, a run's wall time and time breakdown;
* :mod:`~fedkt.tracking.folder`: the run folder itself: :class:`RunRecorder` (config,
  the metrics log, checkpoints), :func:`atomic_write` and the folder's lock;
* :mod:`~fedkt.tracking.tables`: console tables (a round's, time breakdowns);
* :mod:`~fedkt.tracking.summary`: ``summary.md``;
* :mod:`~fedkt.tracking.run_plots`: ``plots/*.png``.

The names below are the package's public interface (``from fedkt.tracking import
RunRecorder``); fedkt's own modules import from the module that does the job.
"""

from fedkt.tracking.folder import (
    CONFIG_FILE,
    HOLDINGS,
    LATEST_FILE,
    LOCK_FILE,
    METRICS_FILE,
    PREDICTIONS_DIR,
    SERVER_STATE,
    SUMMARY_FILE,
    RunFolderBusy,
    RunRecorder,
    atomic_write,
    clear_run_dir,
    run_lock,
)
from fedkt.tracking.rows import (
    MB,
    NON_METRIC_KEYS,
    TIMING_KEYS,
    best_round,
    is_eval,
    is_timing,
    lower_is_better,
    main_metric,
    mean_breakdown,
    metric_keys,
    participant_order,
    read_rows,
    run_wall_time,
    sum_breakdown,
    time_breakdown,
    without_timings,
)
from fedkt.tracking.run_plots import write_plots
from fedkt.tracking.summary import summary_markdown
from fedkt.tracking.tables import (
    breakdown_table,
    fmt_mb,
    fmt_seconds,
    format_table,
    round_table,
)

__all__ = [
    "CONFIG_FILE", "HOLDINGS", "LATEST_FILE", "LOCK_FILE", "MB", "METRICS_FILE",
    "NON_METRIC_KEYS", "PREDICTIONS_DIR", "SERVER_STATE", "SUMMARY_FILE", "TIMING_KEYS",
    "RunFolderBusy", "RunRecorder", "atomic_write", "best_round", "breakdown_table",
    "clear_run_dir", "fmt_mb", "fmt_seconds", "format_table", "is_eval", "is_timing",
    "lower_is_better", "main_metric", "mean_breakdown", "metric_keys", "participant_order",
    "read_rows", "round_table", "run_lock", "run_wall_time", "sum_breakdown", "summary_markdown",
    "time_breakdown", "without_timings", "write_plots",
]
