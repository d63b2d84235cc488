"""The process tests' worker: `serve` as in production, with a handler scripted through the
environment (`ScriptedHandler`), for the worker `WORKER_TEST_BINDING` names.

Run as a script (`python <this file>`) by workers/runtime/tests/test_process.py. Test code
only: it lives with the tests so that no worker image holds it.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import importlib
import os
import sys
import time

from acme.infra.boot import boot
from acme.om.context import OpContext
from acme.om.work.types.handler import WorkHandlerInterface
from acme.om.work.types.work_item import WorkItem, WorkKind
from acme.workers.runtime.errors import escape_log_output
from acme.workers.runtime.server import DatabaseOutage, serve
from acme.workers.runtime.worker import Worker


class ScriptedHandler(WorkHandlerInterface):
    """The process tests' handler, scripted through the environment.

    `WORKER_TEST_LOG`: a file that gets a line `start <item id>` when a run starts,
    `done <item id>` when it ends, and `cancelled <item id> <time.time()>` when the run is
    cancelled (the worker cancels the handler's task: an operator's cancel, a lost lease,
    a drain). `WORKER_TEST_SECONDS`: how long a run takes (default
    0). `WORKER_TEST_HANG_FIRST=1`: the first run of each item (no `start` line for it in
    the log yet) never ends, as a process that is about to be killed.
    `WORKER_TEST_RAISE`: each run raises `ValueError` with this text, Python escapes
    decoded (`bad\\x00byte`: an environment variable cannot hold a NUL).
    """

    def __init__(self) -> None:
        self._log = os.environ["WORKER_TEST_LOG"]
        self._seconds = float(os.environ.get("WORKER_TEST_SECONDS", "0"))
        self._hang_first = os.environ.get("WORKER_TEST_HANG_FIRST") == "1"
        raised = os.environ.get("WORKER_TEST_RAISE")
        self._raise = None if raised is None else codecs.decode(raised, "unicode_escape")

    async def handle(self, ctx: OpContext, item: WorkItem) -> None:
        first = f"start {item.id}" not in self._read()
        self._write(f"start {item.id}")
        try:
            if first and self._hang_first:
                await asyncio.Event().wait()
            await asyncio.sleep(self._seconds)
        except asyncio.CancelledError:
            self._write(f"cancelled {item.id} {time.time()}")
            raise
        if self._raise is not None:
            raise ValueError(self._raise)
        self._write(f"done {item.id}")

    def _read(self) -> str:
        try:
            with open(self._log) as log:
                return log.read()
        except FileNotFoundError:
            return ""

    def _write(self, line: str) -> None:
        with open(self._log, "a") as log:
            log.write(line + "\n")


BINDING_VARIABLE = "WORKER_TEST_BINDING"
"""Names the worker `serve_scripted` serves: `<module>:<attribute>` (default: `PROBE`)."""


def _binding() -> Worker:
    spec = os.environ.get(BINDING_VARIABLE, "acme.workers.runtime.testing:PROBE")
    module, _, attribute = spec.partition(":")
    worker = getattr(importlib.import_module(module), attribute)
    assert isinstance(worker, Worker), f"{spec} is not a Worker"
    return worker


KINDS_VARIABLE = "WORKER_TEST_KINDS"
"""The kinds `serve_scripted` handles, comma-separated (default: the worker's own)."""

SERVE_KINDS_VARIABLE = "WORKER_TEST_SERVE_KINDS"
"""The kinds `serve` claims, comma-separated, as `serve --kind` (default: every kind)."""


def serve_scripted() -> None:
    """The process tests' worker (`python` this file): `serve` as in production for
    the worker `WORKER_TEST_BINDING` names, with `ScriptedHandler` in place of its
    handlers, one per kind `WORKER_TEST_KINDS` names."""
    worker = _binding()
    settings = worker.settings()
    boot(settings.infra, service_name=worker.name)
    escape_log_output()
    container = worker.container.build(settings)
    kinds = os.environ.get(KINDS_VARIABLE, str(worker.kind)).split(",")
    handlers: dict[WorkKind, WorkHandlerInterface] = {
        WorkKind(kind): ScriptedHandler() for kind in kinds
    }
    container = dataclasses.replace(container, handlers=handlers)
    served = [kind for kind in os.environ.get(SERVE_KINDS_VARIABLE, "").split(",") if kind]
    try:
        asyncio.run(serve(worker, settings, container, kinds=served))
    except DatabaseOutage as exc:
        sys.exit(f"{worker.name}: {exc}")


if __name__ == "__main__":
    serve_scripted()
