"""Evidence: paired statistics over per-example predictions, seed groups, suites and claims.

* :mod:`fedkt.evidence.stats`: metrics as sums of per-example components, the paired
  bootstrap (over examples and seeds), the normal approximation, McNemar's exact test;
* :mod:`fedkt.evidence.runs`: run folders (``RUN@ROUND``), participant groups, seed groups;
* :mod:`fedkt.evidence.claims`: claim lines (joint ones with ``and``) and their verdicts;
* :mod:`fedkt.evidence.run_table`: ``fedkt report RUN...``, one row per run (final
  metrics, best round, bytes, wall time; lm-evaluation-harness results);
* :mod:`fedkt.evidence.paired_table`: ``fedkt report RUN... --baseline RUN``, paired
  differences to a baseline with CIs, seed groups' mean ± std, round 0 -> the end
  (``eval.compare_round0``);
* :mod:`fedkt.evidence.suite`: suite files and their runs' state (config, setting);
  :mod:`fedkt.evidence.suite_run`: ``fedkt suite run``; :mod:`fedkt.evidence.suite_report`:
  ``fedkt suite report``; :mod:`fedkt.evidence.suite_keep`: ``fedkt suite status / keep``
  and runs taken from other folders;
* :mod:`fedkt.evidence.method_table`: a suite's cross-method table (accuracy, bytes,
  compute, exposure per arm);
* :mod:`fedkt.evidence.suite_plots`: a suite's figures;
* :mod:`fedkt.evidence.wall`: a suite's wall time and sittings, from its runs' spans;
* :mod:`fedkt.evidence.across`: ``fedkt suite across``, one suite's verdicts under several
  environments (kernel settings);
* :mod:`fedkt.evidence.pooled`: the pooled verdict across kernel settings, blocked by
  fold, and its simulated false-positive rate and power;
* :mod:`fedkt.evidence.power`: ``fedkt suite power``, the folds a target floor needs.

See docs/evidence.md.
"""
