"""A job's lease: which runner holds it, and whether that runner may still be running.

A lease is ``host:pid:token``. On this host a dead pid frees it at once; a lease of
this very process is alive while its runner is (its token is held here); a lease of
another host is alive while its owner commits (its heartbeat is recent).
"""

from __future__ import annotations

import os
import socket
import uuid

STALE_AFTER = 30.0  # a runner on another host that has not committed for this long is gone

# This process's runners, by lease token: a lease with our pid and a token not in here
# was left by a runner of ours that is gone.
_ACTIVE_TOKENS: set[str] = set()


def new_owner() -> str:
    token = uuid.uuid4().hex[:12]
    return f"{socket.gethostname()}:{os.getpid()}:{token}"


def hold(owner: str) -> None:
    """This process's runner holds ``owner``'s lease now."""
    _ACTIVE_TOKENS.add(_token(owner))


def forget_owner(owner: str) -> None:
    """This process's runner that held ``owner``'s lease is gone (the lease row may not say so yet)."""
    _ACTIVE_TOKENS.discard(_token(owner))


def describe(owner: str) -> str:
    """``pid N on HOST``, for a message."""
    host, _, rest = owner.partition(":")
    return f"pid {rest.partition(':')[0]} on {host}"


def owner_alive(owner: str | None, heartbeat: float | None, now_wall: float) -> bool:
    """Whether the runner named by a lease may still be running."""
    if not owner:
        return False
    host, _, rest = owner.partition(":")
    pid_text, _, token = rest.partition(":")
    if host != socket.gethostname():
        return heartbeat is not None and now_wall - heartbeat < STALE_AFTER
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    if pid == os.getpid():
        return token in _ACTIVE_TOKENS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process with that pid: alive, but not ours to judge
        return True
    return True


def _token(owner: str) -> str:
    return owner.rsplit(":", 1)[-1]
