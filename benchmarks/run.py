"""Side-by-side runs of capmon and its peers against the simulated provider.

    python -m benchmarks.run [--items N] [--workers W] [--scenario NAME ...] [--peers NAME ...]
                             [--capmon-set section.key=value ...] [--json FILE] [--details]

For every scenario and every peer, in turn:

1. the peer starts in its own process (``python -m benchmarks.peers``), imports and
   builds its client, and says READY;
2. a fresh simulator starts in another process (``python -m capmon.sim``), so every
   peer meets the same schedule from t = 0 with fresh counters, slots and penalties;
3. the peer runs N items with W workers and writes what it saw to a JSON file;
4. the runner reads the simulator's ``/admin/stats`` (the ground truth for requests,
   rejections and penalties) and stops it.

Client and simulator are separate processes, so on a 2-core machine each has a core
and the simulator's CPU is never charged to (or taken from) the client. The runner
itself only waits.

Then it prints one table per scenario. Columns:

* completed: items answered (of N);
* wall: seconds from the first request to the last answer;
* wall/ideal: against the makespan of a perfect client (see benchmarks/ideal.py);
* req/item: requests the simulator received, divided by N;
* rejected: requests refused (capacity and rate-limit answers, penalties included);
* penalised: requests refused because the key was being punished for hammering;
* pref share: share of completed items served by the preferred (first) model; / informed:
  that share over the informed oracle's (the ideal client that learns of a rise in
  capacity one round trip late, of a fall at once); / ideal: over the ideal's (the one
  that knows every model's capacity the moment it changes);
* p50 / p99: per-item latency (a worker picking the item up to its answer), completed items;
  the *ideal (FCFS)* row gives the ideal first-come-first-served client's, the *informed
  ideal (FCFS)* row the informed oracle's (benchmarks/ideal.py);
* p99 / ideal FCFS p99: the peer's p99 over the ideal's;
* cpu: the client process's CPU seconds during the run, with those of any process it
  started to do the work (capmon-gateway's ``capmon serve``).

Under each table, when capmon ran, its acceptance table: each target (TARGETS) met or
missed, and by how much (the preferred share is judged against the informed oracle's,
and its ratio to the ideal's is shown beside it, not judged; requests / item <= 1.05,
saturated 1.15); after the last scenario, all of them side by side. When capmon and
capmon-gateway both ran, a table prices the gateway against the library. A scenario file
that does not load (one that needs a newer simulator, say) is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.ideal import Ideal, ideal, percentile
from benchmarks.peers import OPTIONAL, PEERS
from benchmarks.procs import Sampler, free_port, get_json, markdown_table, start_simulator, stop, wait_line
from capmon.sim.scenario import Scenario, load_scenario

HERE = Path(__file__).resolve().parent
SCENARIOS = ["outage", "underprovisioned", "saturated", "retry_after", "penalty", "stepped", "rising"]


# ---------------------------------------------------------------- processes


def _revision() -> str:
    """The commit the core was measured at, and whether capmon/ had uncommitted edits."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE.parent, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "capmon"],
            capture_output=True,
            text=True,
            cwd=HERE.parent,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown revision"
    return f"{head or 'unknown'}" + (" + uncommitted edits in capmon/" if dirty else "")


def litellm_available() -> bool:
    try:
        import importlib.util

        return importlib.util.find_spec("litellm") is not None
    except Exception:
        return False


def run_one(
    scn_path: Path,
    scn: Scenario,
    peer: str,
    items: int,
    workers: int,
    time_limit: float,
    options: dict[str, Any],
    log_dir: Path,
) -> dict[str, Any]:
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    out = log_dir / f"{scn.name}-{peer}.json"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    peer_cmd = [
        sys.executable,
        "-m",
        "benchmarks.peers",
        peer,
        "--base-url",
        origin + "/v1",
        "--models",
        ",".join(m.name for m in scn.models),
        "--workers",
        str(workers),
        "--items",
        str(items),
        "--time-limit",
        str(time_limit),
        "--options",
        json.dumps(options),
        "--out",
        str(out),
        "--wait-for-go",
    ]
    peer_log = open(log_dir / f"{scn.name}-{peer}.stderr", "w")
    p = subprocess.Popen(
        peer_cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=peer_log, text=True, cwd=HERE.parent, env=env
    )
    sim = None
    try:
        line = p.stdout.readline().strip() if p.stdout else ""
        if line != "READY":
            p.wait(30)
            raise RuntimeError(f"peer {peer} did not start (exit {p.returncode}); see {peer_log.name}")
        sim = start_simulator(port, scn_path, log_dir / f"{scn.name}-{peer}.sim.log", env)
        offset = get_json(origin + "/admin/stats")["elapsed"]
        sampler = Sampler(origin)
        assert p.stdin is not None
        p.stdin.write("GO\n")
        p.stdin.flush()
        sampler.start()
        try:
            done = wait_line(p, "DONE", time_limit + 120)
        finally:
            utilisation = sampler.stop()
            peak = sampler.peak_rejections()
        if not done:
            raise RuntimeError(f"peer {peer} failed (exit {p.poll()}); see {peer_log.name}")
        stats = get_json(origin + "/admin/stats")
    finally:
        stop(p)
        if sim is not None:
            stop(sim, kill=True)  # its counters are read: no need for a graceful stop
        peer_log.close()
    result = json.loads(out.read_text())
    result["sim"] = stats
    result["offset"] = offset
    result["utilisation"] = utilisation
    result["peak_rejections"] = peak
    return result


# ---------------------------------------------------------------- figures


def figures(result: dict[str, Any], scn: Scenario, items: int, workers: int) -> dict[str, Any]:
    rows = result["items"]
    ok = [r for r in rows if r["ok"]]
    preferred = scn.models[0].name
    best = ideal(scn, items, workers, offset=result["offset"])
    informed = ideal(scn, items, workers, offset=result["offset"], informed=True)
    floor = ideal(scn, items, workers, offset=result["offset"], informed=True, start=INITIAL_LIMIT)
    totals = result["sim"]["totals"]
    rejected = totals["rejected"]["capacity"] + totals["rejected"]["rate_limited"]
    share = sum(1 for r in ok if r["model"] == preferred) / len(ok) if ok else 0.0
    lat = [r["latency"] for r in ok]
    errors: dict[str, int] = {}
    for r in rows:
        if not r["ok"]:
            key = (r["error"] or "?").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    return {
        "completed": len(ok),
        "wall": result["wall"],
        "timed_out": result["timed_out"],
        "ideal": best.makespan,
        "wall_ideal": result["wall"] / best.makespan,
        "req_item": totals["requests"] / items,
        "requests": totals["requests"],
        "rejected": rejected,
        "penalised": totals["penalised"],
        "share": share,
        "ideal_share": best.preferred_share,
        "share_ratio": share / best.preferred_share if best.preferred_share else float("nan"),
        "ideal_informed": informed.makespan,
        "informed_share": informed.preferred_share,
        "share_ratio_informed": share / informed.preferred_share if informed.preferred_share else float("nan"),
        "floor_share": floor.preferred_share,
        "share_ratio_floor": share / floor.preferred_share if floor.preferred_share else float("nan"),
        "p50": percentile(lat, 0.50),
        "p99": percentile(lat, 0.99),
        "ideal_p50": best.p50,
        "ideal_p99": best.p99,
        "p99_ideal": percentile(lat, 0.99) / best.p99 if best.p99 else float("nan"),
        "cpu": result["cpu"],
        "cpu_own": result.get("cpu_own", result["cpu"]),  # the peer's process
        "cpu_helpers": result.get("cpu_helpers", 0.0),  # processes it started for the work (a gateway)
        "errors": errors,
        "utilisation": result.get("utilisation", {}),
        "peak_rejections": result.get("peak_rejections", 0),
        "served": {m.name: sum(1 for r in ok if r["model"] == m.name) for m in scn.models},
        "sim_models": {
            name: {
                "requests": m["requests"],
                "completed": m["completed"],
                "capacity": m["rejected"]["capacity"],
                "rate_limited": m["rejected"]["rate_limited"],
                "penalised": m["penalised"],
            }
            for name, m in result["sim"]["models"].items()
        },
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def table(
    scn: Scenario,
    rows: list[tuple[str, dict[str, Any]]],
    best: Ideal,
    informed: Ideal,
    items: int,
    floor: Ideal | None = None,
) -> str:
    head = (
        "| peer | completed | wall s | wall/ideal | req/item | rejected | penalised | pref share | / informed "
        "| / ideal | p50 s | p99 s | p99 / ideal FCFS p99 | client cpu s |"
    )
    sep = "|" + "---|" * 14
    out = [head, sep]
    oracles = [("*ideal (FCFS)*", best), ("*informed ideal (FCFS)*", informed)]
    if floor is not None:
        oracles.append((f"*informed, from {INITIAL_LIMIT} slots (FCFS)*", floor))
    for label, oracle in oracles:
        share = oracle.preferred_share
        out.append(
            f"| {label} | {items} | {oracle.makespan:.2f} | {_ratio(oracle.makespan, best.makespan):.2f} | 1.00 "
            f"| 0 | 0 | {share:.2f} | {_ratio(share, informed.preferred_share):.2f} "
            f"| {_ratio(share, best.preferred_share):.2f} | {oracle.p50:.2f} | {oracle.p99:.2f} "
            f"| {_ratio(oracle.p99, best.p99):.2f} | |"
        )
    for name, f in rows:
        completed = f"{f['completed']}" + (" (timed out)" if f["timed_out"] else "")
        out.append(
            f"| {name} | {completed} | {f['wall']:.2f} | {f['wall_ideal']:.2f} | {f['req_item']:.2f} "
            f"| {f['rejected']} | {f['penalised']} | {f['share']:.2f} | {f['share_ratio_informed']:.2f} "
            f"| {f['share_ratio']:.2f} | {f['p50']:.2f} | {f['p99']:.2f} | {f['p99_ideal']:.2f} | {f['cpu']:.1f} |"
        )
    return "\n".join(out)


# ---------------------------------------------------------------- acceptance

# capmon's targets, checked per scenario from the figures above (README.md explains each).
# "share_old" is shown, not judged: the old ideal knows of a rise in capacity the moment it
# happens, which no client can.
TARGETS = {
    "completed": "completed 100 %",
    "wall_ideal": "wall / ideal <= 1.10",
    "req_item": "requests / item <= 1.05 (saturated 1.15)",
    "penalised": "0 penalised",
    "share": "preferred share >= 0.9 x the informed oracle's",
    "share_floor": "preferred share / the informed oracle's from the initial limit (shown: the floor)",
    "share_old": "preferred share / the ideal's (shown, not a target)",
    "p99_ideal": "p99 <= 2 x ideal FCFS p99",
    "p99_peers": "p99 <= best peer's p99",
}
SHARE_TARGET = 0.9  # x the informed oracle's preferred share
# capmon-bench.toml's [limiter] initial: what any client configured as capmon is sends to a model
# before an answer has shown it more. The informed oracle held to it for its first round trip
# (benchmarks/ideal.py, ``start``) is the floor for a client that starts there: the informed
# oracle itself knows each model's starting capacity from the first instant.
INITIAL_LIMIT = int(tomllib.loads((HERE / "capmon-bench.toml").read_text(encoding="utf-8"))["limiter"]["initial"])
REQ_ITEM_TARGET = 1.05
# The one scenario with a looser bound on requests per item (issue 30's acceptance).
REQ_ITEM_TARGETS = {"saturated": 1.15}


def req_item_target(scenario: str) -> float:
    return REQ_ITEM_TARGETS.get(scenario, REQ_ITEM_TARGET)


@dataclass(frozen=True)
class Verdict:
    target: str  # the target as this scenario has it ("requests / item <= 1.15")
    met: bool | None  # None: not judged (no peer to compare with, or shown for information)
    text: str  # "**met** (1.04)" / "missed by 0.07 (1.17)" / why it cannot be judged
    key: str = ""  # its TARGETS key: the row of the summary across scenarios


def _verdict(key: str, met: bool, value: str, by: str, target: str | None = None) -> Verdict:
    return Verdict(target or TARGETS[key], met, f"**met** ({value})" if met else f"missed by {by} ({value})", key=key)


def acceptance(
    f: dict[str, Any], items: int, peers: list[tuple[str, dict[str, Any]]], scenario: str = ""
) -> list[Verdict]:
    """capmon's figures ``f`` in ``scenario`` against TARGETS; ``peers`` are the other
    peers' figures in the same scenario. The p99 comparison is with peers that completed
    every item: a peer that failed items has its p99 over the survivors only."""
    limit = req_item_target(scenario)
    share = f"{f['share']:.2f} / {f['informed_share']:.2f}"
    out = [
        _verdict(
            "completed",
            f["completed"] == items,
            f"{f['completed']} of {items}",
            f"{items - f['completed']} items",
        ),
        _verdict("wall_ideal", f["wall_ideal"] <= 1.10, f"{f['wall_ideal']:.2f}", f"{f['wall_ideal'] - 1.10:.2f}"),
        _verdict(
            "req_item",
            f["req_item"] <= limit,
            f"{f['req_item']:.2f}",
            f"{f['req_item'] - limit:.2f}",
            target=f"requests / item <= {limit:.2f}",
        ),
        _verdict("penalised", f["penalised"] == 0, f"{f['penalised']}", f"{f['penalised']} requests"),
        _verdict(
            "share",
            f["share_ratio_informed"] >= SHARE_TARGET,
            f"{f['share_ratio_informed']:.2f} x = {share}",
            f"{SHARE_TARGET - f['share_ratio_informed']:.2f} x",
        ),
        Verdict(
            TARGETS["share_floor"],
            None,
            f"{f['share_ratio_floor']:.2f} x = {f['share']:.2f} / {f['floor_share']:.2f}",
            key="share_floor",
        ),
        Verdict(
            TARGETS["share_old"],
            None,
            f"{f['share_ratio']:.2f} x = {f['share']:.2f} / {f['ideal_share']:.2f}",
            key="share_old",
        ),
        _verdict(
            "p99_ideal",
            f["p99_ideal"] <= 2.0,
            f"{f['p99']:.2f} s = {f['p99_ideal']:.2f} x {f['ideal_p99']:.2f} s",
            f"{f['p99'] - 2.0 * f['ideal_p99']:.2f} s",
        ),
    ]
    rivals = [(name, g) for name, g in peers if g["completed"] == items]
    if not rivals:
        out.append(Verdict(TARGETS["p99_peers"], None, "no other peer completed every item", key="p99_peers"))
    else:
        name, g = min(rivals, key=lambda r: r[1]["p99"])
        out.append(
            _verdict(
                "p99_peers",
                f["p99"] <= g["p99"],
                f"{f['p99']:.2f} s vs {name} {g['p99']:.2f} s",
                f"{f['p99'] - g['p99']:.2f} s",
            )
        )
    return out


def acceptance_table(verdicts: list[Verdict]) -> str:
    met = sum(1 for v in verdicts if v.met)
    judged = sum(1 for v in verdicts if v.met is not None)
    lines = [f"| target (capmon): {met} of {judged} met | |", "|---|---|"]
    lines += [f"| {v.target} | {v.text} |" for v in verdicts]
    return "\n".join(lines)


def acceptance_summary(by_scenario: dict[str, list[Verdict]]) -> str:
    names = list(by_scenario)
    lines = ["| target (capmon) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, target in TARGETS.items():
        cells = [next((v.text for v in by_scenario[n] if v.key == key), "") for n in names]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- the gateway against the library

CAPMON_PEERS = ("capmon", "capmon-gateway")  # capmon itself: never a rival in capmon's own targets


def _priced(lib: dict[str, Any], gw: dict[str, Any]) -> list[str]:
    """The gateway peer's figures over the library's: what going through `capmon serve` costs."""
    cpu = f"{gw['cpu'] / lib['cpu']:.2f}x" if lib["cpu"] else "-"
    return [
        f"{gw['completed']} / {lib['completed']}",
        f"{gw['wall'] / lib['wall']:.2f}x",
        f"{gw['req_item'] - lib['req_item']:+.2f}",
        f"{(gw['p50'] - lib['p50']) * 1000:+.0f}",
        f"{(gw['p99'] - lib['p99']) * 1000:+.0f}",
        f"{gw['cpu']:.2f} = {gw['cpu_own']:.2f} + {gw['cpu_helpers']:.2f}",
        f"{lib['cpu']:.2f}",
        cpu,
    ]


# Gateway over library: completed both, wall and client CPU as ratios, the rest as differences.
PRICED_HEAD = [
    "completed gw / lib",
    "wall gw / lib",
    "req/item gw - lib",
    "p50 ms gw - lib",
    "p99 ms gw - lib",
    "gw cpu s = SDK + gateway",
    "lib cpu s",
    "cpu gw / lib",
]


def gateway_line(lib: dict[str, Any], gw: dict[str, Any]) -> str:
    return markdown_table(PRICED_HEAD, [_priced(lib, gw)])


def gateway_summary(priced: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> str:
    return markdown_table(["scenario", *PRICED_HEAD], [[name, *_priced(*pair)] for name, pair in priced.items()])


def details(scn: Scenario, peer: str, f: dict[str, Any], result: dict[str, Any]) -> str:
    lines = [f"- **{peer}**: served {f['served']}"]
    if f["errors"]:
        lines.append(f"  - failed items by error: {f['errors']}")
    sim = ", ".join(
        f"{m}: {v['requests']} req / {v['completed']} ok / {v['capacity']} capacity / "
        f"{v['rate_limited']} rate-limited ({v['penalised']} penalised)"
        for m, v in f["sim_models"].items()
    )
    lines.append(f"  - simulator: {sim}")
    if f.get("utilisation"):
        lines.append(
            "  - slots in use (mean, while busy): "
            + ", ".join(f"{m} {u:.0%}" for m, u in f["utilisation"].items())
            + f"; most rejections in one 0.2 s sample: {f.get('peak_rejections', 0)}"
        )
    extra = result.get("extra") or {}
    for k, v in extra.items():
        if k == "breaker" and isinstance(v, list):
            shown = v if len(v) <= 12 else v[:6] + [f"... {len(v) - 12} more ..."] + v[-6:]
            lines.append(f"  - breaker transitions ({len(v)}): " + "; ".join(shown))
        else:
            lines.append(f"  - {k}: {v}")
    return "\n".join(lines)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument(
        "--scenario",
        nargs="+",
        default=SCENARIOS,
        help=f"names in benchmarks/scenarios ({', '.join(SCENARIOS)}) or paths",
    )
    ap.add_argument(
        "--peers",
        nargs="+",
        default=[p for p in PEERS if p not in OPTIONAL],
        choices=list(PEERS),
        help=f"default: all but {', '.join(sorted(OPTIONAL))}",
    )
    ap.add_argument(
        "--capmon-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of benchmarks/capmon-bench.toml (repeatable)",
    )
    ap.add_argument(
        "--capmon-whatif",
        action="append",
        default=[],
        metavar="FILE",
        help="a benchmarks/whatif/*.py file that patches capmon's core in the capmon peer's "
        "process (repeatable): measures a proposed change without editing capmon/",
    )
    ap.add_argument(
        "--time-limit", type=float, default=None, help="seconds per peer run (default: 5 x the ideal, at least 60)"
    )
    ap.add_argument("--json", help="write every raw result here")
    ap.add_argument("--details", action="store_true", help="print per-peer diagnostics under each table")
    args = ap.parse_args(argv)

    peers = list(args.peers)
    skipped: list[str] = []
    if "litellm" in peers and not litellm_available():
        peers.remove("litellm")
        skipped.append("litellm (not installed: `pip install -e '.[bench]'`)")

    command = "python -m benchmarks.run " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(f"<!-- {command} -->")
    print(
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}; "
        f"{args.items} items, {args.workers} workers per peer; capmon at {_revision()}"
    )
    if skipped:
        print("skipped: " + "; ".join(skipped))
    print()
    raw: dict[str, Any] = {"command": command, "items": args.items, "workers": args.workers, "scenarios": {}}
    log_dir = Path(tempfile.mkdtemp(prefix="capmon-bench-"))
    options = {"capmon_set": args.capmon_set, "capmon_whatif": [str(Path(p).resolve()) for p in args.capmon_whatif]}
    t_start = time.monotonic()
    verdicts: dict[str, list[Verdict]] = {}
    priced: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # scenario -> (library, gateway) figures
    for name in args.scenario:
        path = Path(name) if name.endswith(".toml") else HERE / "scenarios" / f"{name}.toml"
        try:
            scn = load_scenario(str(path))
        except Exception as e:  # e.g. a scenario that needs a newer simulator: the others still run
            print(f"### {name}: skipped, the scenario does not load: {e}\n")
            continue
        best = ideal(scn, args.items, args.workers)
        informed = ideal(scn, args.items, args.workers, informed=True)
        floor = ideal(scn, args.items, args.workers, informed=True, start=INITIAL_LIMIT)
        limit = args.time_limit or max(60.0, 5 * best.makespan)
        rows: list[tuple[str, dict[str, Any]]] = []
        notes: list[str] = []
        raw["scenarios"][scn.name] = {}
        for peer in peers:
            try:
                result = run_one(path, scn, peer, args.items, args.workers, limit, options, log_dir)
            except Exception as e:  # one broken peer must not lose the others' figures
                notes.append(f"- {peer}: did not run: {e}")
                continue
            f = figures(result, scn, args.items, args.workers)
            rows.append((peer, f))
            raw["scenarios"][scn.name][peer] = {
                "figures": f,
                "result": {k: v for k, v in result.items() if k != "items"},
            }
            if args.details:
                notes.append(details(scn, peer, f, result))
        print(f"### {scn.name}: {scn.description}\n")
        print(table(scn, rows, best, informed, args.items, floor))
        print()
        mine = dict(rows).get("capmon")
        if mine is not None:
            rivals = [(n, f) for n, f in rows if n not in CAPMON_PEERS]
            verdicts[scn.name] = acceptance(mine, args.items, rivals, scn.name)
            raw["scenarios"][scn.name]["acceptance"] = [asdict(v) for v in verdicts[scn.name]]
            print(acceptance_table(verdicts[scn.name]))
            print()
        gateway = dict(rows).get("capmon-gateway")
        if mine is not None and gateway is not None:
            priced[scn.name] = (mine, gateway)
            print(gateway_line(mine, gateway) + "\n")
        if notes:
            print("\n".join(notes))
            print()
        sys.stdout.flush()
    if len(verdicts) > 1:
        print("### capmon against its targets\n")
        print(acceptance_summary(verdicts))
        print()
    if len(priced) > 1:
        print("### capmon through its gateway against the library\n")
        print(gateway_summary(priced))
        print()
    print(f"<!-- total {time.monotonic() - t_start:.0f} s; logs in {log_dir} -->")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
