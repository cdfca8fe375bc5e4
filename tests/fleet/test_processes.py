"""A real second process: its manual trip reaches this one within 100 ms; it is in the
registry with its role; killed (SIGKILL) while holding leases and a probe, its slots
come back when the lease TTL runs out, its probe is taken over, and it leaves the
registry."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from capmon.core.control.breaker import State
from capmon.core.types.config import parse_config
from tests.fleet.helpers import FLAGSHIP, MEDIUM, client, fleet_config, fleet_text, is_probe, store, until
from tests.support.scripted import OVERLOADED, Reply, Script, ok, serve

ROOT = Path(__file__).resolve().parents[2]

# The other process: joins the fleet as a batch worker, obeys one command a line.
CHILD = """
import asyncio, sys
from capmon.core.types.config import load_config
from capmon.runtime import open_engine
from tests.support.configs import ENV

async def main():
    config = load_config(sys.argv[1])
    async with open_engine(config, environ=ENV, role="batch") as engine:
        c = engine.client
        held = []
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line == "trip":
                c.trip("medium", "tripped by the other process")
            elif line == "reset":
                c.reset("medium")
            elif line == "hold":
                for _ in range(2):
                    held.append(await c.target("medium@ep/a").state.admit(1))
                print("HELD", sum(a is not None for a in held), flush=True)
            elif line == "outage":
                for _ in range(3):
                    await c.chat("hi")
                t = c.target("flagship@ep/a").state
                while not (t.view().breaker.state.value == "half-open" and t._probe_lease is not None):
                    await asyncio.sleep(0.005)
                print("PROBING", flush=True)
            elif not line:
                return

asyncio.run(main())
"""


async def _line(proc: subprocess.Popen[str], want: str, timeout: float = 20.0) -> str:
    loop = asyncio.get_running_loop()
    assert proc.stdout is not None
    line = await asyncio.wait_for(loop.run_in_executor(None, proc.stdout.readline), timeout)
    assert line.startswith(want), (line, proc.poll())
    return line


def _send(proc: subprocess.Popen[str], command: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()


async def test_a_real_second_process_shares_trips_leases_probes_and_the_registry(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    script = Script()
    probe_held = {"on": True}
    script.set(
        "flagship",
        lambda n, body: (Reply(200, ok("flagship").body, delay=1.0) if probe_held["on"] else ok("flagship"))
        if is_probe(body)
        else OVERLOADED,
    )
    async with serve(script) as url:
        text = fleet_text(url, redis_url, namespace, medium="max_concurrency = 2")
        full = parse_config(text, "fleet-test.toml")
        # This process has no flagship until the other is killed: the other's prober is the only one.
        cfg = fleet_config(url, redis_url, namespace, medium="max_concurrency = 2", models=("medium",))
        path = tmp_path / "fleet.toml"
        path.write_text(text)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env=env,
        )
        try:
            await _line(proc, "READY")
            async with client(cfg, role="gateway") as me:
                await me.chat("hi")
                tm = me.target(MEDIUM).state
                # its manual trip and reset reach this process (the 100 ms p99 bound is
                # test_propagation's; here a real second process, timed by nothing)
                for command, seen in (("trip", State.FORCED_OPEN), ("reset", State.CLOSED)):
                    _send(proc, command)
                    await until(lambda seen=seen: tm.view().breaker.state is seen, timeout=2.0)
                # the registry: both, with their roles
                await until(lambda: len(me.snapshot().shared.processes) == 2)
                procs = me.snapshot().shared.processes
                assert sorted(p.role for p in procs) == ["batch", "gateway"]
                other = next(p for p in procs if not p.this)
                assert other.pid == proc.pid
                # it probes the flagship, and holds medium's two fleet-wide slots (max_concurrency 2)
                _send(proc, "outage")
                await _line(proc, "PROBING")
                _send(proc, "hold")
                await _line(proc, "HELD 2")
                assert await tm.admit(1) is None  # full, fleet-wide
                probe_held["on"] = False
                proc.send_signal(signal.SIGKILL)
                proc.wait(5)
                killed = time.perf_counter()
                async with client(full) as taker:
                    # the probe it owned is taken over once unrenewed for lease_ttl (0.6 s)
                    tf = taker.target(FLAGSHIP).state
                    await until(lambda: tf.view().breaker.state in (State.RAMP, State.CLOSED), timeout=2.0)
                    took_probe = time.perf_counter() - killed
                    # its leases expire after lease_ttl: the slots come back
                    adm = None
                    while adm is None:
                        tm.slot_freed()
                        adm = await tm.admit(1)
                        if adm is None:
                            assert time.perf_counter() - killed < 0.6 + 0.5
                            await asyncio.sleep(0.01)
                    took_slot = time.perf_counter() - killed
                    await tm.settle(adm, None)
                    # and it leaves the registry (its entry's TTL: three heartbeats)
                    roles = ["gateway", "library"]  # the killed batch worker is gone
                    await until(lambda: sorted(p.role for p in me.snapshot().shared.processes) == roles, timeout=1.0)
                    assert store(me).link.ok
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    assert 0.3 < took_slot < 0.6 + 0.5, took_slot
    assert took_probe < 0.6 + 0.5, took_probe
