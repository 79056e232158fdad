"""Step logs of the Dynamo backend: KILN_LOG=info (or debug) logs the
beginning and the end of each step of every graph (lower, lookup, compile,
load) with the graph's name, on the "kiln" logger; a step that fails logs no
end, so the failing step is the last one begun and not ended."""

import contextlib
import logging
import os
import time

_log = logging.getLogger("kiln")


def _configure_logging():
    level = os.environ.get("KILN_LOG", "").strip().lower()
    if level not in ("info", "debug"):
        return
    _log.setLevel(logging.DEBUG if level == "debug" else logging.INFO)
    if not _log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s kiln %(levelname)s %(message)s"))
        _log.addHandler(handler)


_configure_logging()


@contextlib.contextmanager
def _step(step, graph):
    _log.info("begin %s '%s'", step, graph)
    start = time.perf_counter()
    yield
    _log.info("end %s '%s' (%.1f ms)", step, graph, (time.perf_counter() - start) * 1e3)
