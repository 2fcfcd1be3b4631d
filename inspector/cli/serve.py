"""``inspector app``: the Streamlit command line, the server supervised as a child, and its address and port
checked before it starts."""

from __future__ import annotations

import sys
from pathlib import Path

from inspector.cli.printing import status
from inspector.cli.words import check_capture_arg, check_occurrence, check_referents_arg
from inspector.errors import InspectorError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def app_command(args) -> list[str]:
    """The ``streamlit run`` command line of ``inspector app`` (the app's own options after ``--``)."""
    app = Path(__file__).resolve().parents[2] / "apps" / "app.py"
    if not app.is_file():
        raise InspectorError(f"the app is not at {app}: run `inspector app` from a source checkout (pip install -e .[app])")
    host = getattr(args, "host", None) or "127.0.0.1"
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.headless", "true", "--server.port", str(args.port),
           "--server.address", host, "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal", "--client.showErrorDetails", "type"]
    extra: list[str] = []
    if args.file:
        extra.append(str(Path(args.file).resolve()))
    for opt in ("site", "head", "query", "occurrence", "referents", "variant", "weighting"):
        value = getattr(args, opt, None)
        if value is not None:
            extra += [f"--{opt}", str(Path(value).resolve()) if opt == "variant" else str(value)]
    return cmd + (["--", *extra] if extra else [])


def supervise(cmd: list[str]) -> int:
    """Run ``cmd`` (a Streamlit server) as a child until it ends; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop
    the child too (SIGTERM, then SIGKILL after 10 s). Returns 0 when stopped by a signal, else the child's
    exit status. Used by ``inspector app`` and ``inspector corpus --app``."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd)
    stopping: list[float] = []

    def stop(signum, frame) -> None:
        if not stopping and proc.poll() is None:
            proc.terminate()
        stopping.append(time.monotonic())

    signals = [s for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, stop) for s in signals}
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                if stopping and time.monotonic() - stopping[0] > 10:  # a child that ignores SIGTERM
                    proc.kill()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0 if stopping else rc


def cmd_app(args) -> int:
    """Serve the app; SIGTERM, SIGINT (Ctrl-C) and SIGHUP stop the Streamlit child too (:func:`supervise`)."""
    check_port(getattr(args, "port", None))  # before torch loads (issue 28): the port, the files' headers, site and head
    check_occurrence(getattr(args, "occurrence", None))
    if getattr(args, "referents", None) is not None:
        check_referents_arg(args.referents)
    if getattr(args, "file", None):
        check_capture_arg(args.file, site=getattr(args, "site", None), head=getattr(args, "head", None))
    elif getattr(args, "site", None) is not None or getattr(args, "head", None) is not None:
        raise InspectorError("--site and --head open the app on a head of a capture: give the capture file too")
    if getattr(args, "variant", None):
        check_capture_arg(args.variant)
    check_listen(getattr(args, "host", None) or "127.0.0.1", args.port)  # before Streamlit's own traceback
    from inspector.store.capture_file import load

    for what in ("file", "variant"):
        if getattr(args, what, None):
            load(getattr(args, what))  # refuses a missing or unreadable capture before anything starts
    cmd = app_command(args)
    host = getattr(args, "host", None) or "127.0.0.1"
    if host not in LOOPBACK:
        status(f"inspector: warning: the app listens on {host}: anyone who can reach port {args.port} can open any capture "
                "on this machine by path, upload files and run local models, with no login")
    shown = f"[{host}]" if ":" in host else host
    status(f"starting the app on http://{shown if host not in ('0.0.0.0', '::') else 'localhost'}:{args.port} (Ctrl-C stops it)")
    return supervise(cmd)


def check_listen(host: str, port: int) -> None:
    """Refuse, in one line naming the fix, an address that does not resolve or a port another program holds:
    a socket is bound to ``host:port`` and closed again before the server starts."""
    import errno
    import socket

    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise InspectorError(f"--host {host!r} is not an address of this machine ({getattr(exc, 'strerror', None) or exc}):"
                             " give a valid address, e.g. --host 127.0.0.1") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as sock:
        if sys.platform != "win32":  # as the server binds (Tornado): a port in TIME_WAIT is free, a listening one is not
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except PermissionError:
            raise InspectorError(f"port {port} needs more privileges on this machine: give --port 1024 or above, "
                                 "e.g. --port 8501") from None
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise InspectorError(f"--host {host!r} is not an address of this machine: give one of its addresses, "
                                     "e.g. --host 127.0.0.1") from None
            raise InspectorError(f"port {port} on {host} is not available ({exc.strerror or exc}): another program "
                                 f"holds it; give another with --port N, e.g. --port {port + 1 if port < 65535 else 8501}") \
                from None


def check_port(port: int | None) -> None:
    if port is not None and not 1 <= port <= 65535:
        raise InspectorError(f"--port must be from 1 to 65535, got {port}")
