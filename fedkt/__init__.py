"""fedkt: federated knowledge transfer between a server's large model and clients' small models."""

import logging as _logging
import os as _os

# OpenMP (libgomp, torch's CPU threads) spins a waiting thread before it sleeps. Beside
# another job on the same cores that spinning steals the other job's time: a SmolLM2
# forward pass ran 3x slower (docs/performance.md, "A machine that is not idle").
# PASSIVE unless the user chose a policy; it takes effect only when torch loads after
# this line (the `fedkt` CLI, suite jobs, `import fedkt` first).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# oneDNN (torch's CPU kernels for bf16 matrix products) keeps each product shape's compiled
# kernel in two caches of 1,024 (its own and ideep's, torch's layer above it: an entry
# lives while either holds it), about 0.25 MB each. A run's shapes change with every
# batch's lengths, so they fill: 0.55 GB of a CLINC150 run's 3.0 GB peak; 64 entries cost
# about 1% more CPU time. The same kernels run either way, so no number changes
# (docs/performance.md, "oneDNN's kernel caches bounded"). 64 each unless the user chose
# a size; FEDKT_KERNEL_CACHE=0 keeps the defaults. Like the line above, it takes effect
# only when torch loads after this line.
KERNEL_CACHES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN's, ideep's
if _os.environ.get("FEDKT_KERNEL_CACHE") != "0":
    for _name in KERNEL_CACHES:
        _os.environ.setdefault(_name, "64")

__version__ = "0.1.0"

# bitsandbytes (the `quantization` extra), which peft imports whenever it is installed, warns
# on import that an optional CPU kernel package ("kernels", fetched from the Hugging Face hub)
# is missing; its CPU 4/8-bit path works without it (tests/models/test_big_models.py).
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
