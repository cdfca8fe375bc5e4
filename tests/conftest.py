"""Suite-wide test settings."""

from __future__ import annotations

import os
import sys

from hypothesis import settings

# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE, set on
# this project's machines): without it each xdist worker rewrites and compiles every test
# module afresh, and each of the suite's many `capmon` subprocesses compiles capmon itself,
# which together cost more of the suite's time than most of its tests.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Property tests run the same examples on every run of the default suite, so a run cannot go
# red on an example nobody has seen before; `HYPOTHESIS_PROFILE=explore python -m pytest ...`
# searches afresh (run it by hand, and turn what it finds into fixes and fixed examples).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
