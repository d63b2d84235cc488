"""A worker's console script: `console(worker, argv)`, what its `main.py`'s `cli` calls.

It sets the process's garbage collector (`GC_YOUNG_THRESHOLD`), then imports the command
(`cli.run`, which imports the server) and runs it. `worker.py` holds configuration only:
nothing under `workers/runtime` imports this module or `cli.py`.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence

from acme.workers.runtime.worker import Worker

GC_YOUNG_THRESHOLD = 50_000
"""Allocations, less deallocations, between two collections of the cyclic garbage
collector's youngest generation in a worker process (Python's default: 700). The loop
allocates and frees a few hundred objects per item, nearly all freed by their reference
count, yet at the default a busy worker runs a collection every 40 items or so: about 470
of them, 0.13 s, in a drain of 20,000 items here, and 70 more (65 ms) while `serve`
imports its server. At 50,000 the drain runs none. Garbage in reference cycles waits a little
longer to be freed; the older generations keep Python's thresholds (docs/performance.md).
"""


def console(worker: Worker, argv: Sequence[str] | None = None) -> None:
    """`worker`'s console command (`cli.run`, see there for the exit codes), `argv`
    defaulting to `sys.argv[1:]`.

    The command owns its process, so the garbage collector's threshold is set first, before
    the imports the command needs (`GC_YOUNG_THRESHOLD`)."""
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)
    from acme.workers.runtime.cli import run  # after the threshold: its imports allocate

    run(worker, argv)
