"""Suite-wide test settings."""

from __future__ import annotations

import os

from hypothesis import settings

# Property tests run the same examples on every run of the default suite, so a run cannot go
# red on an example nobody has seen before; `HYPOTHESIS_PROFILE=explore python -m pytest ...`
# searches afresh (run it by hand, and turn what it finds into fixes and fixed examples).
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
