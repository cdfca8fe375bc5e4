"""The fleet against one process: the same load through 8 worker processes (each its own
client, an eighth of the items and of the workers) and through 1 process carrying all of
it, every client on one Redis namespace (``[shared] backend = "redis"``).

    python -m benchmarks.fleet [--items 400] [--workers 32] [--processes 8]
                               [--scenario outage saturated penalty rising stepped]
                               [--redis URL] [--json FILE]

For every scenario and each of the two runs: the worker processes start, build their
clients, join the fleet and say READY; a fresh simulator starts in its own process
(``python -m capmon.sim``, as benchmarks/run.py does); every worker gets GO at once;
the coordinator samples the simulator's /admin/stats five times a second until the last
worker is done. Printed per scenario:

* completed, wall seconds;
* pref share: the preferred (first) model's share of the completed items;
* rejected (the simulator's count of capacity and rate-limit answers, penalties
  included): the 8 against the 1, and their ratio (goal <= 1.2);
* penalised (goal 0);
* trip propagation: for every breaker move one process made (a trip, a probe's
  outcome), how long until each other process had adopted it, p50 / p99 (8 processes
  only);
* Redis round trips per item: the hot path (ADMIT + SETTLE, refused ADMITs included)
  and everything (heartbeats, reconciliation, probes, spends, seeds too);
* added latency: p50 / p99 of one ADMIT or SETTLE call as the client waited for it
  (a request makes two);
* probes of an open breaker: how many the fleet sent per open model, how many processes
  sent them, and the most that were out at once (1: one stream for the fleet, however
  many processes; the 1-process run's count beside it);
* the climb, for a scenario whose preferred model's capacity rises (its schedule, read
  from the scenario file): for each rise, how long after it the preferred model's
  in-flight count (the simulator's, as sampled) first reached the new capacity, in the
  1-process run and in the 8's, and the 8's minus the 1's (goal: at most about one
  round trip, the model's mean service time: the fleet climbs together, not slower than
  one process). "not reached" when it never did before the capacity changed again or
  the run ended.

Not a test: it prints figures (benchmarks/README.md, "python -m benchmarks.fleet").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.ideal import percentile, service_time, slots_at
from benchmarks.procs import Sampler, free_port, get_json, read_line, start_simulator, stop
from capmon.sim.scenario import Scenario, load_scenario

HERE = Path(__file__).resolve().parent
SCENARIOS = ("outage", "saturated", "penalty", "rising", "stepped")
DEFAULT_REDIS = "redis://127.0.0.1:6379/14"


# ---------------------------------------------------------------- one worker process


def _config(base_url: str, redis_url: str, namespace: str) -> Any:
    from capmon.core.types.config import parse_config

    text = (HERE / "capmon-bench.toml").read_text(encoding="utf-8").replace("http://SIMULATOR/v1", base_url)
    text += f'\n[shared]\nbackend = "redis"\nurl = "{redis_url}"\nnamespace = "{namespace}"\nrequired = true\n'
    return parse_config(text, str(HERE / "capmon-bench.toml"))


async def _worker(args: argparse.Namespace) -> None:
    from capmon.core.types import events as ev
    from capmon.core.types.result import Request
    from capmon.fleet import RedisState
    from capmon.runtime import open_engine

    config = _config(args.base_url, args.redis, args.namespace)
    moves: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    async with open_engine(config, environ={}, role="batch") as engine:
        client = engine.client
        state = client.state
        assert isinstance(state, RedisState)

        began: dict[str, tuple[float, bool]] = {}  # target -> when this process's probe was granted, taken over

        def on_event(e: ev.Event) -> None:
            if isinstance(e, ev.BreakerChanged) and e.new == "half-open" and "[fleet" not in e.reason:
                began[e.target] = (time.time(), "taking over" in e.reason)
            if isinstance(e, ev.BreakerChanged):
                gen = state.target(e.target).local.breaker.generation
                moves.append(
                    {"t": time.time(), "target": e.target, "new": e.new, "gen": gen, "own": "[fleet" not in e.reason}
                )
            elif isinstance(e, ev.ProbeFinished) and e.breaker:  # this process's probe of an open breaker
                # From the moment BEGIN_PROBE granted it, for as long as it took to answer (the
                # event itself comes after SETTLE's round trip, later under load).
                start, took_over = began.pop(e.target, (time.time() - e.latency, False))
                probes.append({"start": start, "latency": e.latency, "model": e.model, "ok": e.ok, "over": took_over})

        engine.bus.subscribe(on_event)
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        if (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "GO":
            return
        items = list(range(args.first, args.first + args.items))
        latencies: list[float] = []
        served: dict[str, int] = {}  # completed items per serving model
        failed: list[str] = []
        t0 = time.perf_counter()

        async def work() -> None:
            while items:
                i = items.pop(0)
                start = time.perf_counter()
                try:
                    result = await client.chat(
                        Request.of(
                            f"Item {i}: summarise the quarterly report for region {i % 17} in three sentences.",
                            item_id=str(i),
                        )
                    )
                    latencies.append(time.perf_counter() - start)
                    served[result.model] = served.get(result.model, 0) + 1
                except Exception as e:  # noqa: BLE001 - counted, not hidden
                    failed.append(f"{type(e).__name__}: {e}"[:160])

        await asyncio.gather(*(work() for _ in range(args.workers)))
        wall = time.perf_counter() - t0
        calls = dict(state.link.calls)
        verdicts = dict(state.link.verdicts)
        out = {
            "completed": len(latencies),
            "failed": failed,
            "wall": wall,
            "latencies": latencies,
            "served": served,
            "hot": list(state.link.hot),
            "calls": calls,
            "verdicts": verdicts,
            "requests": client.journal.requests,
            "moves": moves,
            "probes": probes,
            "id": state.id,
            "degraded": state.link.losses,
        }
    Path(args.out).write_text(json.dumps(out))
    print("DONE", flush=True)


# ---------------------------------------------------------------- the coordinator


def run_once(scenario: Path, processes: int, items: int, workers: int, redis_url: str, log_dir: Path) -> dict[str, Any]:
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    namespace = f"capmon-bench-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen[str]] = []
    outs: list[Path] = []
    per, extra = divmod(items, processes)
    first = 0
    sim = None
    sampler: Sampler | None = None
    try:
        for i in range(processes):
            n = per + (1 if i < extra else 0)
            out = log_dir / f"{scenario.stem}-{processes}-{i}.json"
            outs.append(out)
            log = open(log_dir / f"{scenario.stem}-{processes}-{i}.stderr", "w")
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.fleet",
                        "--worker",
                        "--base-url",
                        origin + "/v1",
                        "--redis",
                        redis_url,
                        "--namespace",
                        namespace,
                        "--items",
                        str(n),
                        "--first",
                        str(first),
                        "--workers",
                        str(max(1, workers // processes)),
                        "--out",
                        str(out),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    cwd=HERE.parent,
                    env=env,
                )
            )
            first += n
        for p in procs:
            if read_line(p, 60) != "READY":
                raise RuntimeError(f"a worker did not start (exit {p.poll()}); see {log_dir}")
        sim = start_simulator(port, scenario, log_dir / f"{scenario.stem}-{processes}.sim.log", env)
        sampler = Sampler(origin)
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("GO\n")
            p.stdin.flush()
        sampler.start()
        for p in procs:
            if read_line(p, 600) != "DONE":
                raise RuntimeError(f"a worker failed (exit {p.poll()}); see {log_dir}")
        stats = get_json(origin + "/admin/stats")
    finally:
        if sampler is not None:
            sampler.stop()
        for p in procs:
            stop(p)
        if sim is not None:
            stop(sim, kill=True)
        _drop(redis_url, namespace)
    assert sampler is not None
    return {
        "workers": [json.loads(o.read_text()) for o in outs],
        "sim": stats,
        "samples": sampler.samples,
        "times": sampler.times,
    }


def _drop(redis_url: str, namespace: str) -> None:
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        keys = list(r.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            r.delete(*keys)
    finally:
        r.close()


def propagation(workers: list[dict[str, Any]]) -> list[float]:
    """For each breaker move (target, generation, new state) one process made: from its
    making it to each other process's adopting it (as news from the fleet), in seconds.
    Moves every process makes by itself (a ramp completing by time) are not news."""
    made: dict[tuple[str, int, str], float] = {}
    adopted: dict[tuple[str, int, str], list[float]] = {}
    for w in workers:
        for m in w["moves"]:
            key = (m["target"], m["gen"], m["new"])
            if m["own"]:
                made[key] = min(made.get(key, m["t"]), m["t"])
            else:
                adopted.setdefault(key, []).append(m["t"])
    return [t - made[key] for key, times in adopted.items() if key in made for t in times]


def probe_streams(workers: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per model, the probes of its open breaker the whole fleet sent, how many processes
    sent them, the most that were out at the same moment, and how many took over a probe
    whose owner went silent (its lease unrenewed)."""
    out: dict[str, dict[str, int]] = {}
    by_model: dict[str, list[tuple[float, float, str]]] = {}
    over: dict[str, int] = {}
    for w in workers:
        for p in w.get("probes", []):
            over[p["model"]] = over.get(p["model"], 0) + bool(p.get("over"))
    for w in workers:
        for p in w.get("probes", []):
            by_model.setdefault(p["model"], []).append((p["start"], p["start"] + p["latency"], w["id"]))
    for model, spans in by_model.items():
        edges = sorted([(a, 1) for a, _, _ in spans] + [(b, -1) for _, b, _ in spans], key=lambda x: (x[0], x[1]))
        out_now = most = 0
        for _, step in edges:
            out_now += step
            most = max(most, out_now)
        out[model] = {
            "probes": len(spans),
            "processes": len({who for _, _, who in spans}),
            "at_once": most,
            "taken_over": over.get(model, 0),
        }
    return out


def rises(scn: Scenario, until: float) -> list[dict[str, Any]]:
    """The preferred model's rises in capacity before ``until`` (the simulator's clock),
    from the scenario's schedule: when, from how many slots to how many, until when the
    new capacity holds (the next change, or ``until``), and the round trip that shows it
    (the model's mean service time then)."""
    spec, repeat = scn.models[0], scn.repeat
    starts = sorted(
        {k * repeat + p.at for p in spec.schedule for k in range(int(until // repeat) + 1 if repeat > 0 else 1)}
    )
    starts = [t for t in starts if 0 < t < until]
    changes = [t for t in starts if slots_at(spec, t, repeat) != slots_at(spec, t - 1e-6, repeat)]
    out = []
    for i, t in enumerate(changes):
        before, after = slots_at(spec, t - 1e-6, repeat), slots_at(spec, t, repeat)
        if after > before:
            end = changes[i + 1] if i + 1 < len(changes) else until
            out.append({"at": t, "from": before, "to": after, "until": end, "rtt": service_time(spec, t, repeat)})
    return out


def climbs(run: dict[str, Any], scn: Scenario, horizon: float) -> list[dict[str, Any]]:
    """For each rise of the preferred model's capacity before ``horizon`` (the same for
    the runs compared): how long after it the sampled in-flight count first reached the
    new capacity (None: not before the next change, or the run's end)."""
    name, times, samples = scn.models[0].name, run["times"], run["samples"]
    out = []
    for r in rises(scn, until=horizon):
        took = next(
            (
                t - r["at"]
                for t, s in zip(times, samples, strict=False)
                if r["at"] <= t < r["until"] and name in s and s[name][0] >= r["to"]
            ),
            None,
        )
        out.append({**r, "took": took})
    return out


def figures(run: dict[str, Any], items: int, scn: Scenario) -> dict[str, Any]:
    ws = run["workers"]
    totals = run["sim"]["totals"]
    hot = [x for w in ws for x in w["hot"]]
    calls: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    for w in ws:
        for k, v in w["calls"].items():
            calls[k] = calls.get(k, 0) + v
        for k, v in w["verdicts"].items():
            verdicts[k] = verdicts.get(k, 0) + v
    lat = [x for w in ws for x in w["latencies"]]
    delays = propagation(ws)
    completed = sum(w["completed"] for w in ws)
    preferred = sum(w["served"].get(scn.models[0].name, 0) for w in ws)
    return {
        "completed": completed,
        "share": preferred / completed if completed else float("nan"),
        "failed": sum(len(w["failed"]) for w in ws),
        "wall": max(w["wall"] for w in ws),
        "rejected": totals["rejected"]["capacity"] + totals["rejected"]["rate_limited"],
        "penalised": totals["penalised"],
        "requests": totals["requests"],
        "hot_per_item": (calls.get("admit", 0) + calls.get("settle", 0)) / items,
        "all_per_item": sum(calls.values()) / items,
        "calls": calls,
        "verdicts": verdicts,
        "hot_p50_ms": percentile(hot, 0.50) * 1000 if hot else float("nan"),
        "hot_p99_ms": percentile(hot, 0.99) * 1000 if hot else float("nan"),
        "p50": percentile(lat, 0.50) if lat else float("nan"),
        "p99": percentile(lat, 0.99) if lat else float("nan"),
        "moves": len(delays),
        "prop_p50_ms": percentile(delays, 0.50) * 1000 if delays else float("nan"),
        "prop_p99_ms": percentile(delays, 0.99) * 1000 if delays else float("nan"),
        "degraded": sum(w["degraded"] for w in ws),
        "probes": probe_streams(ws),
    }


def _took(x: float | None, unit: str = "") -> str:
    return "not reached" if x is None else f"{x:.2f}{unit}"


def report(name: str, one: dict[str, Any], many: dict[str, Any], processes: int, preferred: str) -> str:
    ratio = many["rejected"] / one["rejected"] if one["rejected"] else (1.0 if not many["rejected"] else float("inf"))
    rows = [
        f"### {name}",
        "",
        "| run | completed | wall s | pref share | rejected | penalised | requests | p50 s | p99 s | round trips / "
        "item (hot / all) | ADMIT or SETTLE p50 / p99 ms | trip propagation p50 / p99 ms (moves) |",
        "|" + "---|" * 12,
    ]
    for label, f in (("1 process", one), (f"{processes} processes", many)):
        prop = f"{f['prop_p50_ms']:.1f} / {f['prop_p99_ms']:.1f} ({f['moves']})" if f["moves"] else "-"
        rows.append(
            f"| {label} | {f['completed']} | {f['wall']:.2f} | {f['share']:.3f} | {f['rejected']} | {f['penalised']} | "
            f"{f['requests']} | {f['p50']:.2f} | {f['p99']:.2f} | {f['hot_per_item']:.2f} / "
            f"{f['all_per_item']:.2f} | {f['hot_p50_ms']:.2f} / {f['hot_p99_ms']:.2f} | {prop} |"
        )
    models = sorted(set(one["probes"]) | set(many["probes"]))
    if models:
        rows += [
            "",
            "| probes of an open breaker | 1 process | "
            + f"{processes} processes: probes (processes that sent them), most out at once, taken over |",
            "|---|---|---|",
        ]
        for m in models:
            a, b = one["probes"].get(m, {}), many["probes"].get(m, {})
            rows.append(
                f"| {m} | {a.get('probes', 0)} | {b.get('probes', 0)} ({b.get('processes', 0)}), "
                f"{b.get('at_once', 0)} at once, {b.get('taken_over', 0)} taken over |"
            )
    goals = []
    if one["climbs"]:
        rows += [
            "",
            f"| rise of {preferred} | round trip s | in flight = capacity after: 1 process s | "
            f"{processes} processes s | {processes} - 1 s |",
            "|---|---|---|---|---|",
        ]
        for a, b in zip(one["climbs"], many["climbs"], strict=False):
            gap = b["took"] - a["took"] if a["took"] is not None and b["took"] is not None else None
            rows.append(
                f"| {a['from']} -> {a['to']} slots at {a['at']:g} s | {a['rtt']:.2f} | {_took(a['took'])} | "
                f"{_took(b['took'])} | {'-' if gap is None else f'{gap:+.2f}'} |"
            )
            if b["took"] is None:
                verdict = "n/a" if a["took"] is None else "missed"
            else:
                verdict = "**met**" if gap is None or gap <= a["rtt"] else "missed"
            goals.append(
                f"climb to {a['to']} slots after {a['at']:g} s, {processes} against 1: {_took(b['took'], ' s')} "
                f"against {_took(a['took'], ' s')} (goal: within one round trip, {a['rtt']:.2f} s, of the 1's: "
                f"{verdict})"
            )
    rows += [
        "",
        f"rejected, {processes} / 1: {many['rejected']} / {one['rejected']} = {ratio:.2f} (goal <= 1.2: "
        f"{'**met**' if ratio <= 1.2 else 'missed'}); penalised: {one['penalised']} and {many['penalised']} "
        f"(goal 0: {'**met**' if one['penalised'] == many['penalised'] == 0 else 'missed'}); "
        f"{preferred}'s share: {one['share']:.3f} and {many['share']:.3f}",
        *(f"\n{g}" for g in goals),
    ]
    return "\n".join(rows)


# A provider that is never full and answers in 2 ms: one worker sending one request
# after another leaves the event loop idle, so a hot-path call's time is Redis's round
# trip and redis-py's own work, not the wait for a busy loop.
QUIET = """
name = "quiet"
description = "One roomy model answering in 2 ms: the hot path's own cost."
seed = 1

[[models]]
name = "sim-flagship"
slots = 64
base_latency = 0.002
per_token = 0.0
answer_tokens = 5
noise = 0.0
context_window = 128000

[[models]]
name = "sim-medium"
slots = 64
base_latency = 0.002
per_token = 0.0
answer_tokens = 5
noise = 0.0

[[models]]
name = "sim-small"
slots = 64
base_latency = 0.002
per_token = 0.0
answer_tokens = 5
noise = 0.0
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=400)
    ap.add_argument("--workers", type=int, default=32, help="concurrent workers in all (divided among the processes)")
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--scenario", nargs="+", default=list(SCENARIOS))
    ap.add_argument(
        "--redis",
        default=os.environ.get("CAPMON_BENCH_REDIS_URL", DEFAULT_REDIS),
        help=f"the Redis every client shares (default {DEFAULT_REDIS}; a fresh namespace per run)",
    )
    ap.add_argument("--json", metavar="FILE", help="every figure, raw")
    ap.add_argument(
        "--quiet",
        type=int,
        default=500,
        metavar="N",
        help="then N requests one after another on a quiet loop: the hot path's own latency (0: skip)",
    )
    # one worker process (started by the coordinator)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base-url", help=argparse.SUPPRESS)
    ap.add_argument("--namespace", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args))
        return 0
    print(
        f"{args.items} items, {args.workers} workers: 1 process against {args.processes} "
        f"({args.workers // args.processes} workers each), Redis {args.redis}\n"
    )
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="capmon-fleet-bench-") as tmp:
        for name in args.scenario:
            path = Path(name) if name.endswith(".toml") else HERE / "scenarios" / f"{name}.toml"
            scn = load_scenario(path)
            runs = [run_once(path, n, args.items, args.workers, args.redis, Path(tmp)) for n in (1, args.processes)]
            horizon = max((r["times"][-1] for r in runs if r["times"]), default=0.0)
            one, many = (figures(r, args.items, scn) | {"climbs": climbs(r, scn, horizon)} for r in runs)
            raw[path.stem] = {"1": one, str(args.processes): many}
            print(report(path.stem, one, many, args.processes, scn.models[0].name) + "\n", flush=True)
        if args.quiet:
            quiet = Path(tmp) / "quiet.toml"
            quiet.write_text(QUIET)
            f = figures(run_once(quiet, 1, args.quiet, 1, args.redis, Path(tmp)), args.quiet, load_scenario(quiet))
            raw["quiet"] = f
            print(
                f"### the hot path on a quiet loop\n\n{args.quiet} requests one after another, 1 process: "
                f"ADMIT or SETTLE p50 {f['hot_p50_ms']:.2f} ms, p99 {f['hot_p99_ms']:.2f} ms; "
                f"{f['hot_per_item']:.2f} hot-path round trips per request",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
