"""``python -m capmon.sim ...`` is ``capmon sim ...``: the same parser (capmon/cli.py) and
the same command (capmon/sim/command.py), for scripts that run the simulator with this
interpreter rather than the ``capmon`` script on PATH (benchmarks/procs.py)."""

from __future__ import annotations

import sys

from capmon.cli import main

if __name__ == "__main__":
    sys.exit(main(["sim", *sys.argv[1:]]))
