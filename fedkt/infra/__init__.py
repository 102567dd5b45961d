"""What every job stands on, whichever method it runs.

* :mod:`fedkt.infra.cache`: the on-disk cache and its safe concurrent writes;
* :mod:`fedkt.infra.timing`: seconds per phase; :mod:`fedkt.infra.progress`: progress bars;
* :mod:`fedkt.infra.memory`: freed heap given back to the OS after each training step and phase;
* :mod:`fedkt.infra.precision`: mixed precision and CPU threads;
* :mod:`fedkt.infra.placement`: which device each model goes to;
* :mod:`fedkt.infra.seeds`: seeds derived from a run's seed, and seeding every generator;
* :mod:`fedkt.infra.environment`: the machine and libraries a run records;
* :mod:`fedkt.infra.plugins`: the ``FEDKT_PLUGINS`` modules every process imports;
* :mod:`fedkt.infra.templates`: the checks on a prompt template;
* :mod:`fedkt.infra.lazy`: a package's names imported on first use.
"""
