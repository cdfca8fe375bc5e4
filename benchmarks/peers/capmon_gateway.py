"""Peer (f): capmon through its gateway. The peer starts ``capmon serve`` in a process of
its own, on the targets ``benchmarks/capmon-bench.toml`` gives the library peer (the same
models, endpoint, limiter, breaker and backoff, ``--capmon-set`` overrides included), and
its workers send their items there with the openai SDK (``AsyncOpenAI``,
``max_retries=0``, ``model="auto"``: the config's preference order), so every retry,
wait and fallback is the gateway's. The gateway's CPU counts as the client's
(``helper_cpu``): the table prices the gateway against the library.

It also starts the gateway for ``benchmarks/gateway.py`` (``start_gateway``), and is
the launcher that applies ``--capmon-whatif`` patches (or uvloop) inside the gateway's
process before handing over to capmon's own CLI:

    python -m benchmarks.peers.capmon_gateway [--whatif FILE ...] [--uvloop] -- serve --config F --listen H:P
"""

from __future__ import annotations

import argparse
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.peers.base import Item, PeerContext
from benchmarks.peers.capmon_client import CONFIG, apply_whatif, bench_config
from benchmarks.procs import cpu_seconds, read_line, rss_mb, spawn, stop
from capmon.core.types.config import parse_config

KEY_ENV = "CAPMON_BENCH_GATEWAY_KEY"
# A client key, as a gateway anyone could reach would have: every request is authenticated.
GATEWAY_TABLE = f'\n[gateway]\nkeys = [{{ env = "{KEY_ENV}", alias = "bench" }}]\n'
BANNER = re.compile(r"listening on http://127\.0\.0\.1:(\d+)/v1")


# ---------------------------------------------------------------- the gateway's config


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise ValueError(f"cannot write {value!r} into the gateway's config")


def set_toml_value(text: str, section: str, key: str, value: object) -> str:
    """``text`` with ``key = value`` in its ``[section]`` table (replaced, or added under
    the header), or a new table at the end. A config file cannot name a table twice, so
    an override is an edit, not an appended table."""
    lines = text.splitlines()
    line = f"{key} = {_toml_value(value)}"
    try:
        start = next(i for i, s in enumerate(lines) if s.strip() == f"[{section}]")
    except StopIteration:
        return text.rstrip("\n") + f"\n\n[{section}]\n{line}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    for i in range(start + 1, end):
        if pattern.match(lines[i]):
            lines[i] = line
            break
    else:
        lines.insert(start + 1, line)
    return "\n".join(lines) + "\n"


def config_text(base_url: str, overrides: Sequence[str] = ()) -> str:
    """capmon-bench.toml on ``base_url`` with ``overrides`` (SECTION.KEY=VALUE, read as the
    library peer reads them) and a ``[gateway]`` table: the library peer's config as a file."""
    wanted = bench_config(base_url, list(overrides))  # the values, typed and checked
    text = CONFIG.read_text(encoding="utf-8").replace("http://SIMULATOR/v1", base_url)
    for o in overrides:
        section, _, key = o.partition("=")[0].strip().partition(".")
        text = set_toml_value(text, section, key, getattr(getattr(wanted, section), key))
    text += GATEWAY_TABLE
    got = parse_config(text, str(CONFIG))
    for section in ("client", "backoff", "breaker", "limiter"):
        if getattr(got, section) != getattr(wanted, section):  # the edit must read back as the library's
            raise AssertionError(f"the gateway's [{section}] differs from the library peer's")
    return text


# ---------------------------------------------------------------- the gateway's process


@dataclass
class Gateway:
    """``capmon serve`` running in its own process; ``stop()`` when done."""

    proc: subprocess.Popen[str]
    port: int
    key: str = field(repr=False)
    workdir: tempfile.TemporaryDirectory[str] = field(repr=False)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.origin + "/v1"

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def stop(self) -> None:
        stop(self.proc)
        self.workdir.cleanup()


def gateway_command(
    config: Path, whatif: Sequence[str] = (), uvloop: bool = False, args: Sequence[str] = ()
) -> list[str]:
    """``capmon serve`` on ``config``, on a port the kernel picks (the banner says which),
    with ``args`` after; through this module's launcher only when something must be
    patched in first."""
    serve = ["serve", "--config", str(config), "--listen", "127.0.0.1:0", *args]
    if not whatif and not uvloop:
        return [sys.executable, "-m", "capmon.cli", *serve]
    patches = [a for w in whatif for a in ("--whatif", str(Path(w).resolve()))]
    loop = ["--uvloop"] if uvloop else []
    return [sys.executable, "-m", "benchmarks.peers.capmon_gateway", *patches, *loop, "--", *serve]


def start_gateway(
    upstream: str,
    overrides: Sequence[str] = (),
    whatif: Sequence[str] = (),
    uvloop: bool = False,
    stderr: Any = None,
    timeout: float = 60.0,
    args: Sequence[str] = (),
    tables: str = "",
    env: dict[str, str] | None = None,
) -> Gateway:
    """Start ``capmon serve`` in front of ``upstream`` (an OpenAI base URL) and wait for
    its banner. Its log goes to ``stderr`` (a file, or None: ours). ``args``: more of
    capmon serve's arguments; ``tables``: TOML tables added to its config (``[shared]``);
    ``env``: more of its environment (PYTHONPATH: another checkout of capmon)."""
    workdir = tempfile.TemporaryDirectory(prefix="capmon-bench-gateway-")
    config = Path(workdir.name) / "gateway.toml"
    config.write_text(config_text(upstream, overrides) + tables, encoding="utf-8")
    key = "sk-bench-" + secrets.token_hex(16)
    cmd = gateway_command(config, whatif, uvloop, args)
    if env and "PYTHONPATH" in env:
        # -P: `-m` would put the working directory (this checkout) first on sys.path, ahead of
        # PYTHONPATH, and the other checkout's row would run this one's capmon.
        cmd.insert(1, "-P")
    proc = spawn(
        cmd,
        env={**(env or {}), KEY_ENV: key},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,  # the banner only; never the peer's stdout, where the runner reads READY / DONE
        stderr=stderr,
        text=True,
    )
    banner = read_line(proc, timeout)
    found = BANNER.search(banner)
    if found is None:
        stop(proc)
        workdir.cleanup()
        raise RuntimeError(f"capmon serve did not start (exit {proc.poll()}): {banner or 'no banner'}")
    return Gateway(proc, int(found.group(1)), key, workdir)


# ---------------------------------------------------------------- the peer


class CapmonGatewayPeer:
    def __init__(self, ctx: PeerContext) -> None:
        self.ctx = ctx
        self.deadline = bench_config(ctx.base_url, ctx.options.get("capmon_set", [])).client.deadline
        self.gateway: Gateway | None = None
        self.client: Any = None
        self.attempts = 0
        self.fellback = 0

    async def __aenter__(self) -> CapmonGatewayPeer:
        import openai

        self.gateway = start_gateway(
            self.ctx.base_url, self.ctx.options.get("capmon_set", []), self.ctx.options.get("capmon_whatif", [])
        )
        # The SDK waits longer than the gateway's deadline, so the gateway's answer (a 429
        # when nothing could serve in time) is what an item ends with, never the SDK's timeout.
        self.client = openai.AsyncOpenAI(
            base_url=self.gateway.base_url, api_key=self.gateway.key, max_retries=0, timeout=self.deadline + 10
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
        if self.gateway is not None:
            self.gateway.stop()

    async def call(self, item: Item) -> str:
        raw = await self.client.chat.completions.with_raw_response.create(model="auto", messages=item.messages)
        completion = raw.parse()  # what a caller does with the answer: part of the client's cost
        self.attempts += int(raw.headers.get("x-capmon-attempts", "1"))
        self.fellback += int(raw.headers.get("x-capmon-fallbacks", "0"))
        model: str = raw.headers.get("x-capmon-model") or completion.model
        return model

    def helper_cpu(self) -> float:
        return self.gateway.cpu() if self.gateway is not None else 0.0

    def extra(self) -> dict[str, Any]:
        gw = self.gateway
        return {
            "gateway_cpu_s": round(gw.cpu(), 2) if gw else None,
            "gateway_rss_mb": round(gw.rss_mb(), 1) if gw else None,
            "attempts_answered": self.attempts,  # the sum of x-capmon-attempts over answered items
            "fell_back": self.fellback,
            "whatif": [Path(p).stem for p in self.ctx.options.get("capmon_whatif", [])],
        }


def make(ctx: PeerContext) -> CapmonGatewayPeer:
    return CapmonGatewayPeer(ctx)


# ---------------------------------------------------------------- the launcher


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers.capmon_gateway", description=__doc__.split("\n\n")[0])
    ap.add_argument("--whatif", action="append", default=[], metavar="FILE", help="a benchmarks/whatif/*.py patch")
    ap.add_argument("--uvloop", action="store_true", help="serve on uvloop's event loop (a what-if)")
    ap.add_argument("capmon", nargs=argparse.REMAINDER, help="-- then capmon's own arguments")
    args = ap.parse_args(argv)
    apply_whatif(args.whatif)
    if args.uvloop:
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    from capmon.cli import main as capmon_main

    rest = args.capmon[1:] if args.capmon[:1] == ["--"] else args.capmon
    return capmon_main(rest)


if __name__ == "__main__":
    sys.exit(main())
