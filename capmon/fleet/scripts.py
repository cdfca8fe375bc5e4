"""The Lua scripts (capmon/fleet/lua/) and the names of every Redis key they touch.

Each script is ``lib.lua`` followed by its own body, registered with redis-py (EVALSHA,
loaded again by redis-py when a restarted Redis answers NOSCRIPT). Every script reads
Redis's own clock and returns it, so the process can convert shared times to its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

LUA = Path(__file__).resolve().parent / "lua"
NAMES = ("admit", "settle", "begin_probe", "manual", "transition", "seed", "heartbeat", "spend", "pin")


class ManualAction(StrEnum):
    """What a person did by hand, as MANUAL (``manual.lua``) takes it, or the pin (``pin.lua``):
    kept until Redis has it, while the process runs on its own state."""

    TRIP = "trip"
    FORCE_CLOSE = "force_close"
    RESET = "reset"
    PIN = "pin"


def source(name: str) -> str:
    return (LUA / "lib.lua").read_text(encoding="utf-8") + "\n" + (LUA / f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """One registered script per name: ``await scripts.admit(keys=[...], args=[...])``."""

    admit: AsyncScript
    settle: AsyncScript
    begin_probe: AsyncScript
    manual: AsyncScript
    transition: AsyncScript
    seed: AsyncScript
    heartbeat: AsyncScript
    spend: AsyncScript
    pin: AsyncScript

    def __init__(self, client: Redis) -> None:
        for name in NAMES:
            setattr(self, name, client.register_script(source(name)))


@dataclass(frozen=True, slots=True)
class Keys:
    """Every key of one namespace. A target's keys embed its id (``model@endpoint/alias``)."""

    ns: str

    @property
    def events(self) -> str:
        return f"{self.ns}:events"

    @property
    def pin(self) -> str:
        return f"{self.ns}:pin"

    @property
    def budget(self) -> str:
        return f"{self.ns}:budget"

    @property
    def lessons(self) -> str:
        return f"{self.ns}:lessons"

    @property
    def procs(self) -> str:
        return f"{self.ns}:procs"

    @property
    def meta(self) -> str:
        return f"{self.ns}:meta"

    @property
    def proc_prefix(self) -> str:
        return f"{self.ns}:proc:"

    def proc(self, pid: str) -> str:
        return f"{self.ns}:proc:{pid}"

    def target(self, tid: str) -> str:
        return f"{self.ns}:t:{{{tid}}}"

    def leases(self, tid: str) -> str:
        return f"{self.ns}:t:{{{tid}}}:leases"

    def rpm(self, tid: str) -> str:
        return f"{self.ns}:t:{{{tid}}}:rpm"

    def waiting(self, tid: str) -> str:
        return f"{self.ns}:t:{{{tid}}}:waiting"

    def tpm(self, tid: str) -> str:
        return f"{self.ns}:t:{{{tid}}}:tpm"

    def key(self, key_ref: tuple[str, str]) -> str:
        return f"{self.ns}:key:{key_ref[0]}/{key_ref[1]}"

    def type_of(self, key: str) -> str | None:
        """The Redis type each key of the namespace must have (None: not a key of ours,
        or the events channel, which is no key): what a WRONGTYPE is checked against."""
        if not key.startswith(f"{self.ns}:"):
            return None
        rest = key[len(self.ns) + 1 :]
        if rest.startswith("t:{") and "}" in rest:
            return _TARGET_TYPES.get(rest[rest.rfind("}") + 1 :])
        if rest.startswith(("proc:", "key:")):
            return "hash"
        return _TYPES.get(rest)


_TARGET_TYPES = {"": "hash", ":leases": "zset", ":waiting": "zset", ":rpm": "hash", ":tpm": "hash"}
_TYPES = {"pin": "string", "budget": "hash", "lessons": "hash", "procs": "zset", "meta": "hash", "events": None}
