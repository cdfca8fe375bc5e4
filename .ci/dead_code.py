"""Dead code in capmon/: vulture (pinned in the test extra), run by .ci/run.

vulture reads capmon/ and benchmarks/ and reports what is unused in capmon/. Tests are not
its users: a function only tests call is code no user runs, and is reported like any other
(delete it, or have the tests reach the production path that does the job). Tests are not
checked themselves.

Confidence 60 is the level at which vulture reports unused functions, methods,
classes, attributes, properties and variables at all; above it only unused imports
(90, which ruff's F401 finds too), unused arguments and unreachable code (100) remain. So 60, with
IGNORED below for the names vulture cannot see used: what a framework calls or reads by name,
the public API that users call, enum members chosen by value, fields read by serialisation,
and the few counters and handles that tests read to see what the code did. A new one goes
there, with its reason; anything else vulture names is dead: delete it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import vulture

MIN_CONFIDENCE = 60
ROOT = Path(__file__).resolve().parents[1]
READ = ("capmon", "benchmarks")  # not tests: a name only tests use is reported
CHECKED = ROOT / "capmon"

IGNORED = {
    # Textual calls these by name: compose, message handlers (on_*), watchers of reactives
    # (watch_*), key-binding actions (action_*), check_action, a command provider's discover.
    "compose",
    "on_mount",
    "on_unmount",
    "on_resize",
    "on_capmon_app_events_arrived",
    "on_worker_state_changed",
    "on_filter_bar_changed",
    "on_filter_bar_done",
    "on_button_pressed",
    "on_input_changed",
    "on_input_submitted",
    "on_option_list_option_selected",
    "watch_paused",
    "watch_needle",
    "check_action",
    "action_help",
    "action_toggle_pause",
    "action_filter",
    "action_quit",
    "action_switch_model",
    "action_automatic",
    "action_trip",
    "action_reset",
    "action_force_close",
    "action_toggle_batch",
    "action_answer",
    "action_close",
    "action_cancel",
    "action_clear",
    "discover",
    # ... and reads these class variables and reactives (an OptionList's highlighted row; a
    # Rich Text's justify when it renders).
    "TITLE",
    "CSS_PATH",
    "DEFAULT_CSS",
    "border_title",
    "border_subtitle",
    "highlighted",
    "justify",
    # uvicorn calls these overrides (capmon/serving.py's GuestServer, capmon/gateway/connections.py's
    # protocol) and reads the protocol's keep-alive timeout.
    "capture_signals",
    "main_loop",
    "send_400_response",
    "timeout_keep_alive",
    # ... and its request cycle reads disconnected (set when a body proves malformed); h11's
    # readers call the receive buffer's maybe_extract_lines (capmon/gateway/framing.py's StrictBuffer).
    "disconnected",
    "maybe_extract_lines",
    # tenacity reads its retry state's idle_for (capmon/core/control/backoff.py keeps it true).
    "idle_for",
    # OpenTelemetry's span processor calls its exporter's force_flush (capmon/gateway/trace_relay.py).
    "force_flush",
    # httpx calls its transports' handle_request (capmon/inprocess/transport.py).
    "handle_request",
    # logging calls its queue handler's enqueue and handleError, its queue listener's enqueue_sentinel
    # (capmon/gateway/gateway_log.py).
    "enqueue",
    "handleError",
    "enqueue_sentinel",
    # Starlette's router reads its redirect_slashes (capmon/gateway/app.py turns it off).
    "redirect_slashes",
    # A field of a target's Redis hash that only the scripts read (heartbeat.lua): the codec decodes
    # it with the rest so that a garbage value in it is caught like any other (capmon/fleet/codec.py).
    "probe_owner",
    # Snapshot fields no capmon code reads by name: they are for the JSON a gateway's control
    # API and `capmon status --json` serve (core/types/serial.py writes every field).
    "breaker_reason",
    "events_published",
    "never_reached",
    # ... and event fields, for the same JSON (the control API's event feed, a remote dashboard).
    "caller_request_id",
    "from_deployment",
    # An audit row's cost, read from the store by column (AuditRow.of takes the row in order):
    # the report sums the column in SQL, the export writes every field.
    "cost_usd",
    # A capability read by its Feature's name (capabilities.has: getattr(..., feature.value)),
    # on the config's table and the catalogue's entry alike.
    "images",  # a DeploymentMoved's id the model had where it left (the event log shows where it went)
    # The public API, which users call and capmon itself does not: capmon.sim's running_simulator
    # and its handle's admin_url (exported in capmon.sim.__all__), FallbackClient.stream_responses
    # (README, "Use it as a library"), ChatResult.tool_calls, Engine.simulator_started (capmon.Engine).
    "running_simulator",
    "admin_url",
    "stream_responses",
    "tool_calls",
    "simulator_started",
    # Enum members chosen by value (a config's or a request's string), never by name:
    # anthropic-version 2023-06-01 (core/types/config.py, sim/messages.py), client.transport =
    # "aiohttp" (core/routing/transport.py), the simulator's html_500 fault (sim/faults.py).
    "V2023_06_01",
    "AIOHTTP",
    "HTML_500",
    # What tests read to see what the code did, which nothing in production needs to read: the
    # event bus's delivery counts (core/types/events.py), the limiter's cuts and a token bucket's level
    # (core/control/limiter.py), the prober's probes out (core/routing/prober.py: a probe holds a slot), and the
    # Redis listener's subscription, which a fault-injection test breaks (fleet/store.py).
    "delivered",
    "subscriber_errors",
    "cuts",
    "available",
    "probing",
    "_pubsub",
}


def main() -> int:
    scan = vulture.Vulture(ignore_names=sorted(IGNORED))
    scan.scavenge([str(ROOT / part) for part in READ])
    dead = [
        item
        for item in scan.get_unused_code(min_confidence=MIN_CONFIDENCE)
        if Path(item.filename).resolve().is_relative_to(CHECKED)
    ]
    for item in dead:
        print(item.get_report(), file=sys.stderr)
    if dead:
        print(
            f"vulture: {len(dead)} unused name(s) in capmon/ (delete them, or, when one is used where vulture "
            f"cannot see it (by name, by value, by users), add it to IGNORED in .ci/dead_code.py with the reason)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
