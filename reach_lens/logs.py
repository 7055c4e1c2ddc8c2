"""Where reach_lens says what it is doing: every module logs to its own ``logging`` logger under ``reach_lens``
(a study's is ``reach_lens.experiments.<study>``), nothing prints to stderr itself.

    say = logs.say("census")                 # say("...") logs at INFO: "[census] ..." on stderr
    logs.configure_output(quiet=True)        # warnings and errors only, and no progress bars

An application that configures ``logging`` itself can leave ``configure_output`` uncalled: the records then go
where its handlers send them. The experiment scripts call it from ``--quiet`` / ``--verbose``.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable

STUDIES = "reach_lens.experiments"  # the parent of the studies' loggers


def logger(study: str) -> logging.Logger:
    """The logger of a study, ``reach_lens.experiments.<study>``: its lines read "[<study>] message"."""
    return logging.getLogger(f"{STUDIES}.{study}")


def say(study: str) -> Callable[[str], None]:
    """What a study is doing, logged at INFO by its logger (hidden by ``--quiet``)."""
    return logger(study).info


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record comes (pytest and notebooks replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _):
        pass


class _Lines(logging.Formatter):
    """ "[<study>] message", or "[<study>] warning: message" above INFO; other reach_lens loggers by their
    module ("[models] ...")."""

    def format(self, record: logging.LogRecord) -> str:
        name = record.name.removeprefix(f"{STUDIES}.").removeprefix("reach_lens.")
        level = "" if record.levelno <= logging.INFO else f"{record.levelname.lower()}: "
        text = f"[{name}] {level}{record.getMessage()}"
        return text + ("\n" + self.formatException(record.exc_info) if record.exc_info else "")


_HANDLER = _CurrentStderr()
_HANDLER.setFormatter(_Lines())
_TQDM_INIT = None  # tqdm's own __init__ while quiet hides the bars


def configure_output(quiet: bool = False, verbose: bool = False) -> None:
    """Route reach_lens's loggers to stderr at WARNING (``quiet``), DEBUG (``verbose``) or INFO, and hide every tqdm
    progress bar when ``quiet``. Safe to call again (a rerun in one process)."""
    root = logging.getLogger("reach_lens")
    root.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    root.propagate = False  # one line per message, also when the application configured the root logger
    _hide_progress_bars(quiet)


def _hide_progress_bars(hidden: bool) -> None:
    """tqdm reads its one global switch (``TQDM_DISABLE``) only when it is imported, before any script can parse
    ``--quiet``: this sets the same default, ``disable=True``, on the class every bar (ours, the localization
    steps', TRL's) is made of, and puts tqdm's own back when ``hidden`` is False."""
    import tqdm.std

    global _TQDM_INIT
    if hidden and _TQDM_INIT is None:
        _TQDM_INIT = tqdm.std.tqdm.__dict__["__init__"]
        tqdm.std.tqdm.__init__ = functools.partialmethod(_TQDM_INIT, disable=True)
    elif not hidden and _TQDM_INIT is not None:
        tqdm.std.tqdm.__init__, _TQDM_INIT = _TQDM_INIT, None
