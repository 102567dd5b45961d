"""Evidence: paired statistics over per-example predictions, seed groups, suites and claims.

* :mod:`fedkt.evidence.stats`: metrics as sums of per-example components, the paired
  bootstrap (over examples and seeds), the normal approximation, McNemar's exact test;
* :mod:`fedkt.evidence.runs`: run folders (``RUN@ROUND``), participant groups, seed groups;
* :mod:`fedkt.evidence.claims`: claim lines and their verdicts;
* :mod:`fedkt.evidence.suite`: ``fedkt suite run / report``;
* :mod:`fedkt.evidence.compare`: ``fedkt report --baseline``.

See docs/evidence.md.
"""
