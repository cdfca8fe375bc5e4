"""Proposed core changes, as monkeypatches applied only inside the benchmark's capmon
peer process (``python -m benchmarks.run --capmon-whatif benchmarks/whatif/NAME.py``).

They exist to measure a recommendation before anyone edits capmon/: each file says
which change to capmon/core it stands for. They reach into private attributes and
are expected to break when the core changes; they are evidence, not a feature, and a
what-if is deleted once the core has its change (the four that shaped the core's second
cut, hint scope, limiter capacity, breaker order and the fair queue, are in the core now).
"""
