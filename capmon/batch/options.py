"""Errors in a job's options, and the one option that is parsed from text pairs.

An option's error names the option and its value, never a command-line flag: the CLI
adds its flag when it reports one (``concurrency: ...`` is shown as
``--concurrency: ...``).
"""

from __future__ import annotations

from collections.abc import Iterable

from capmon.core.exceptions import BatchError


class OptionError(BatchError):
    """A value given for one of a job's options is wrong. ``option`` names it as the
    option fields do (``concurrency``, ``rate``, ``window``, ``remap``, ``out``);
    ``value`` is the value when the message shows it; ``detail`` says what was expected."""

    def __init__(self, option: str, detail: str, *, value: str | None = None) -> None:
        self.option = option
        self.value = value
        self.detail = detail
        super().__init__(f"{option}{'' if value is None else ' ' + value}: {detail}")


def parse_remap(pairs: Iterable[str]) -> dict[str, str]:
    """``OLD=NEW`` pairs -> {OLD: NEW}: items naming model OLD (gone from the config) go to NEW."""
    out: dict[str, str] = {}
    for pair in pairs:
        old, sep, new = pair.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new:
            raise OptionError(
                "remap", "expected OLD=NEW, a model the job's items name and one in the config", value=pair
            )
        if old in out and out[old] != new:
            raise OptionError("remap", f"given twice ({out[old]} and {new})", value=old)
        out[old] = new
    return out
