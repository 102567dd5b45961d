"""fedkt: federated knowledge transfer between a server's large model and clients' small models."""

import logging as _logging

__version__ = "0.1.0"

# bitsandbytes (the `quantization` extra), which peft imports whenever it is installed, warns
# on import that an optional CPU kernel package ("kernels", fetched from the Hugging Face hub)
# is missing; its CPU 4/8-bit path works without it (tests/models/test_big_models.py).
_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(_logging.ERROR)
