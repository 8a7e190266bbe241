"""Stopping a service a test started as a subprocess, the way Kubernetes does."""

from __future__ import annotations

import signal
import subprocess


def sigterm_and_collect(proc: subprocess.Popen, timeout: float = 60) -> str:
    """SIGTERM, wait up to ``timeout`` (then SIGKILL); returns what it printed (if piped)."""
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""
