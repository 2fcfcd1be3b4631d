"""The one signal handler of every command: SIGINT, SIGTERM and SIGHUP raised as :class:`Terminated`, and the
line and exit status a command stopped by one ends with."""

from __future__ import annotations

import contextlib
import sys


class Terminated(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised where the program is (a kind of KeyboardInterrupt), so every write cleans up
    as on Ctrl-C: a temporary file is removed, a half-built results folder too, and what was there before stays.
    ``signum`` is the signal; :func:`signal_line` the command's last line and exit status for it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def signal_line(exc: BaseException) -> tuple[str, int]:
    """The one line and the exit status a command stopped by ``exc`` ends with: ``inspector: interrupted`` and 130
    for Ctrl-C (SIGINT, or a KeyboardInterrupt without a signal), ``inspector: terminated`` and 128 + the signal's
    number for SIGTERM (143) and SIGHUP (129)."""
    import signal

    signum = getattr(exc, "signum", signal.SIGINT)
    return ("inspector: interrupted" if signum == signal.SIGINT else "inspector: terminated"), 128 + int(signum)


class SignalOwner:
    """What :func:`terminate_as_interrupt` yields: :meth:`received`, the exception of the signal that stopped the
    command (None: none), and :meth:`close`, after which a signal changes nothing (the command has said how it
    ended)."""

    def __init__(self) -> None:
        self.closed = False

    def received(self) -> BaseException | None:
        """The first signal's exception (raised or swallowed), or None."""
        from inspector.store.files import SIGNALS

        return SIGNALS.received

    def close(self) -> None:
        """Ignore every signal from now on: the outcome is decided and being reported."""
        self.closed = True


@contextlib.contextmanager
def terminate_as_interrupt(keep: bool = False):
    """The one signal handler of every command: while the block runs, SIGINT, SIGTERM and SIGHUP each raise
    :class:`Terminated` instead of ending the process on the spot (which would leave ``.tmp`` files and
    ``.NAME.*.new`` folders behind), through :data:`inspector.store.files.SIGNALS`: the first signal is raised at
    once, or where a clean-up or the making of a temporary file holds it (:meth:`~inspector.store.files.Signals.hold`),
    when that ends; every later one is ignored, so the clean-up it starts is not cut short. A signal swallowed where
    Python cannot raise (a ``__del__``, e.g. tqdm's) prints no traceback (``sys.unraisablehook``) and is raised again
    at the next check (:meth:`~inspector.store.files.Signals.check`). Yields a :class:`SignalOwner`. When the block
    ends, temporary files still listed are removed and the handlers are put back as they were, or, with ``keep`` (the
    process ends right after), left ignoring signals, so that the status the command reported is the process's.
    Only in the main thread, and only for a signal whose handler is the default (Python's for SIGINT)."""
    import signal
    import threading

    from inspector.store.files import SIGNALS

    owner = SignalOwner()
    if threading.current_thread() is not threading.main_thread():
        yield owner
        return
    SIGNALS.reset()

    def handler(signum, frame) -> None:
        if not owner.closed and SIGNALS.arrive(Terminated(signum)):
            raise SIGNALS.received

    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    if hasattr(signal, "SIGHUP"):
        defaults[signal.SIGHUP] = signal.SIG_DFL
    old = {sig: signal.signal(sig, handler) for sig, default in defaults.items() if signal.getsignal(sig) is default}
    unraisable = sys.unraisablehook

    def hook(info) -> None:  # a signal raised inside a __del__: reported as the command's line, not a traceback
        if SIGNALS.received is None or info.exc_value is not SIGNALS.received:
            unraisable(info)

    sys.unraisablehook = hook
    try:
        yield owner
    finally:
        owner.closed = True
        SIGNALS.sweep()
        sys.unraisablehook = unraisable
        if not keep:
            for sig, h in old.items():
                signal.signal(sig, h)
        SIGNALS.reset()
