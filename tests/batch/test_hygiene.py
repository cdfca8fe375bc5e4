"""The batch layer, the audit log and reports work without the dashboard's dependencies."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import sys
for name in ("textual", "rich", "capmon.tui"):
    sys.modules[name] = None  # any import of these now raises ImportError
import capmon.batch, capmon.batch.commands, capmon.batch.export, capmon.audit, capmon.report, capmon.advice
print("ok")
"""


def test_batch_audit_and_report_import_without_textual_or_rich() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
