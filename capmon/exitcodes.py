"""The exit codes of every capmon command, documented in docs/cli.md.

Here, and nowhere else, so the command line and the command functions below it
(``capmon.batch.commands``, ``capmon.report``) agree without importing each other.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED_ITEMS = 1  # a batch finished but some items failed (not for capacity reasons)
EXIT_USAGE = 2  # bad arguments, bad config, bad input file: any CapmonError
EXIT_UNREACHABLE = 3  # capmon status --probe: an endpoint could not be connected to (DNS, refused, TLS, proxy)
EXIT_INTERRUPTED = 130  # stopped by Ctrl+C or SIGTERM (a batch job resumes from there)
