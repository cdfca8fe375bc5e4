"""A PostgreSQL server of a test's own: Debian's postgresql 15 binaries, a cluster made in a
temporary folder, listening where the test says (a loopback port, or a network namespace's
address), which the test may stop, restart and kill. Run as the ``postgres`` user (initdb
refuses root); trust auth, no fsync (a test's data need not survive the machine)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

BIN = Path("/usr/lib/postgresql/15/bin")


def available() -> str | None:
    """Why no such server can be made here, or None."""
    if not (BIN / "initdb").exists():
        return f"no {BIN}/initdb (apt-get install postgresql-15)"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user to run initdb as"
    if os.geteuid() != 0:
        return "not root: cannot run initdb as the postgres user"
    return None


class PgServer:
    def __init__(self, host: str, port: int, *, netns: str | None = None) -> None:
        self.host, self.port, self.netns = host, port, netns
        self.dir = Path(tempfile.mkdtemp(prefix="capmon-pg-"))
        self.data = self.dir / "data"
        user = pwd.getpwnam("postgres")
        os.chown(self.dir, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        with open(self.data / "pg_hba.conf", "a") as f:  # the other "machines" connect from their addresses
            f.write("host all all 0.0.0.0/0 trust\n")
        self.url = f"postgresql://postgres@{host}:{port}/postgres"

    def _cmd(self, tool: str, *args: str) -> list[str]:
        cmd = ["runuser", "-u", "postgres", "--", str(BIN / tool), *args]
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(self._cmd(tool, *args), check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        opts = (
            f"-h {self.host} -p {self.port} -k {self.dir} -c fsync=off -c synchronous_commit=off "
            f"-c full_page_writes=off -c max_connections=100"
        )
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-o", opts, "-w", "-t", "30", "start")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                psycopg.connect(self.url, connect_timeout=1).close()
                return
            except psycopg.Error:
                time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL on {self.host}:{self.port} did not start")

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            self._cmd("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop"), capture_output=True, timeout=60
        )

    def restart(self) -> None:
        self.stop()
        self.start()

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)
