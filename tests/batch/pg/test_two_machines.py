"""Two machines on one job (slow, root): two network namespaces joined by a bridge (veth
pairs), a third namespace holding the job's PostgreSQL and the fleet's Redis on its own
address, the simulator on the bridge's. One worker runs on each machine; machine A's is
SIGKILLed mid-job, and machine B's finishes the job: every item once, in input order.

    pytest -m slow tests/batch/pg/test_two_machines.py -s
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from capmon.batch.export import export_job
from capmon.batch.store import pg_location, read_progress
from capmon.core.base.exceptions import BatchError
from capmon.sim.server import running_simulator
from tests.batch.helpers import write_items
from tests.batch.pg import server
from tests.batch.pg.test_acceptance import SLOW
from tests.support.configs import SIMULATED_MODELS, write_config

pytestmark = pytest.mark.slow

URL_ENV = "CAPMON_TEST_JOBS_URL"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


class Network:
    """A bridge on this host and a namespace per machine, each with a veth on the bridge."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:5]
        self.subnet = f"10.{random.randint(100, 250)}.{random.randint(1, 250)}"
        self.bridge = f"capbr{tag}"
        self.host = f"{self.subnet}.1"
        self.spaces: dict[str, str] = {}  # name -> address
        self._tag = tag
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.host}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def machine(self, name: str, n: int) -> str:
        ns, outside = f"cap{name}{self._tag}", f"cv{name}{self._tag}"
        address = f"{self.subnet}.{n}"
        sh("ip", "netns", "add", ns)
        self.spaces[ns] = address
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", outside, "master", self.bridge)
        sh("ip", "link", "set", outside, "up")
        for cmd in (
            ("ip", "addr", "add", f"{address}/24", "dev", "eth0"),
            ("ip", "link", "set", "eth0", "up"),
            ("ip", "link", "set", "lo", "up"),
            ("ip", "route", "add", "default", "via", self.host),
        ):
            sh("ip", "netns", "exec", ns, *cmd)
        return ns

    def remove(self) -> None:
        for ns in self.spaces:
            subprocess.run(["ip", "netns", "pids", ns], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def network() -> Iterator[Network]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    why = server.available()
    if why:
        pytest.skip(why)
    try:
        net = Network()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"cannot make a bridge here: {e.stderr.decode().strip()}")
    try:
        yield net
    finally:
        net.remove()


async def in_namespace(ns: str, argv: list[str], url: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "ip",
        "netns",
        "exec",
        ns,
        sys.executable,
        "-m",
        "capmon.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, URL_ENV: url},
    )


async def test_two_machines_one_killed_the_other_finishes_the_job(network: Network, tmp_path: Path) -> None:
    n = 1500
    db_ns = network.machine("db", 10)
    db_host = network.spaces[db_ns]
    a, b = network.machine("a", 11), network.machine("b", 12)
    pg = server.PgServer(db_host, 5432, netns=db_ns)
    redis = subprocess.Popen(
        ["ip", "netns", "exec", db_ns, "redis-server", "--bind", db_host, "--port", "6379", "--save", ""],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"postgresql://postgres@{db_host}:5432/postgres?schema=capmon"
    db = pg_location(url, from_env=True)
    src = write_items(tmp_path / "in.jsonl", n)
    t0 = time.monotonic()
    try:
        pg.start()
        async with running_simulator(SLOW, host=network.host, admin_key=uuid.uuid4().hex) as sim:
            cfg = write_config(
                tmp_path / "config.toml",
                sim.base_url,
                endpoint="sim",
                simulated=True,
                keys=[("CAPMON_TEST_UNSET_KEY", "sim-key")],
                models={m: SIMULATED_MODELS[m] for m in ("flagship", "medium")},
                extra=f'[shared]\nbackend = "redis"\nurl = "redis://{db_host}:6379/0"\nnamespace = "trial"\n',
            )
            argv = ["batch", "run", str(src), "--config", str(cfg), "--db-url-env", URL_ENV, "--job", "two"]
            argv += ["--concurrency", "16", "--lease-ttl", "3", "--no-progress"]
            on_a, on_b = await in_namespace(a, argv, url), await in_namespace(b, argv, url)
            # Kill machine A's worker once it has done a share of the job.
            while True:
                await asyncio.sleep(0.2)
                try:
                    p = await asyncio.to_thread(read_progress, db, "two")
                except BatchError:
                    continue
                if p.done >= n // 4:
                    break
                assert on_a.returncode is None and on_b.returncode is None
            on_a.send_signal(signal.SIGKILL)  # ip netns exec runs the worker in its own process: it dies
            await on_a.wait()
            killed_at = p.done
            _, err = await asyncio.wait_for(on_b.communicate(), 180)
            assert on_b.returncode == 0, err.decode()[-2000:]
        out = tmp_path / "out.jsonl"
        summary = export_job(db, "two", out)
        ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
        assert ids == [f"it-{i:04d}" for i in range(1, n + 1)] and summary.done == n
        final = read_progress(db, "two")
        assert final.state == "finished" and sum(c for _, c in final.workers) == n
        print(
            f"\ntwo machines ({a} {network.spaces[a]}, {b} {network.spaces[b]}), PostgreSQL and Redis on "
            f"{db_host}: A killed at {killed_at} done; B finished in {time.monotonic() - t0:.1f}s; "
            f"shares {final.workers}; B said: {err.decode().strip().splitlines()[-1]}"
        )
    finally:
        redis.kill()
        pg.remove()
