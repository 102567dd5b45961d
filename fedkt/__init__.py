"""fedkt: federated knowledge transfer between a server's large model and clients' small models."""

import logging as _logging
import os as _os

# OpenMP (libgomp, torch's CPU threads) spins a waiting thread before it sleeps. Beside
# another job on the same cores that spinning steals the other job's time: a SmolLM2
# forward pass ran 3x slower (docs/performance.md, "A machine that is not idle").
# PASSIVE unless the user chose a policy; it takes effect only when torch loads after
# this line (the `fedkt` CLI, suite jobs, `import fedkt` first).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

# bitsandbytes (the `quantization` extra), which peft imports whenever it is installed, warns
# on import that an optional CPU kernel package ("kernels", fetched from the Hugging Face hub)
# is missing; its CPU 4/8-bit path works without it (tests/models/test_big_models.py).
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
