"""The ``fleetclaims`` console script: ``cli.main``, then an exit without interpreter teardown.

Tearing the interpreter down (clearing every module, freeing every object one by one) costs a
cold command 9-20 ms after its work is done and its output written (bench/run.py coldstart: a
third of what is left of the 150 ms budget once the interpreter has started). Everything a
command makes durable is durable before ``main`` returns (the journal is flushed per operation,
checkpoints are complete files), and the kernel releases the lock and closes descriptors when
the process ends, so the only work teardown does that matters is done here first: the
``atexit`` handlers (logging's flush, among others) and flushing stdout and stderr. Whenever a
non-daemon thread is still running or flushing fails, the ordinary exit runs instead.
``cli.main`` itself returns normally (tests and ``python -m fleetclaims`` call it).

The cyclic garbage collector runs rarely for commands that end within moments: they make few
reference cycles (everything else is freed by reference counting), and its passes over the
objects the imports and a listing build cost a cold ``list --json`` on 10,000 claims ~8 ms. A
young-generation pass every 100,000 allocations instead of every 700 keeps what a large
export leaves in cycles bounded. Commands that may run for hours (``run``, ``mcp``,
``top``, ``--follow``) keep the usual settings.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys
import threading
from typing import NoReturn

# Commands that may run for hours: they keep the collector's usual settings.
LONG_RUNNING = frozenset({"run", "mcp", "top"})


def needs_collector(argv: list[str]) -> bool:
    """Whether the command in ``argv`` may run long enough to need the cyclic collector's
    usual settings. (When unsure, yes: collecting costs time, never correctness.)"""
    from . import _command_of

    command = _command_of(argv)
    return command is None or command in LONG_RUNNING or "--follow" in argv or "-f" in argv


SHORT_COMMAND_THRESHOLD = (100_000, 20, 100)


def run() -> NoReturn:
    usual = gc.get_threshold()
    gc.set_threshold(*SHORT_COMMAND_THRESHOLD)  # before the imports: many objects, few cycles
    from . import main

    if needs_collector(sys.argv[1:]):
        gc.set_threshold(*usual)
    code = main()
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread()
           for t in threading.enumerate()):
        sys.exit(code)  # the ordinary exit waits for them
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()  # each handler runs once (the list is cleared), as on exit
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        sys.exit(code)  # report as the ordinary exit would (e.g. a closed pipe)
    os._exit(code)
