"""The pool benchmark: one model on three deployments, used as one pool (issue 32).

``python -m benchmarks.pool`` plays ``benchmarks/scenarios/pool.toml`` on the simulator:
one model in three regions (8, 12 and 16 slots; the second is out from 4 s to 9 s) and a
smaller model after it. Every peer meets a fresh simulator from t = 0, in this process one
after the other, so the figures of one run are side by side:

* ``capmon-room``: capmon, ``[[models]] spread = "room"`` (the default): the three regions
  are one model's deployments and a request goes to the one with the most room left;
* ``capmon-order``: capmon, ``spread = "order"``: each region overflows into the next;
* ``litellm``: LiteLLM's Router (the optional ``bench`` extra), the three regions as three
  deployments under one ``model_name``, the small model as its fallback, with the routing
  strategy of ``--litellm-strategy`` (by default its best for each run: ``BEST_STRATEGY``; each
  is a row with ``--litellm-strategy all``).

Two runs: ``slots`` (the regions' concurrency is the limit: no client is told it) and
``rpm`` (each region also has a requests-per-minute quota, 120, 180 and 240, given to both
clients as the deployments' ``rpm``). The simulator has no per-minute limits of its own, so
in the ``rpm`` run the quota is the clients' to keep: the table counts the requests a client
sent beyond it (``over rpm``: a real region would have refused them with a 429).

The figures: throughput against the ideal's (``ideal / wall``: the fluid ideal, the sum of
what the regions and the small model can serve, with the quotas in the ``rpm`` run, as
``benchmarks.ideal`` computes it, tail included); requests and rejections per item; p50 /
p99 latency; the share of items on the small model; and ``small w/ room``: the share of
the small model's requests sent while a region had room (two slots free, and in the ``rpm``
run a request's worth of its quota), read from the simulator's counters every 0.1 s.

Beside the peers, three oracles (``oracles``, benchmarks/ideal.py): the ideal, the informed oracle
(it learns of region b's return one round trip late) and the informed oracle held to ``[limiter]
initial`` for its first round trip, the floor of a client that starts where capmon does. Their
schedules are replayed as the simulator's counters (``replay``), so ``small w/ room`` measures them
exactly as it measures the peers.

The machine running it is shared: the figures are noisy, read ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.ideal import Ideal, ideal, percentile, slots_at
from benchmarks.peers.base import KEY, Item, PeerContext, run_peer
from benchmarks.peers.capmon_client import apply_whatif, bench_config
from benchmarks.procs import free_port, get_json, markdown_table, start_simulator, stop
from benchmarks.run import INITIAL_LIMIT
from capmon.core.routing.client import FallbackClient
from capmon.core.types.config import Config, Spread
from capmon.core.types.result import Request
from capmon.sim.scenario import Scenario, load_scenario

HERE = Path(__file__).resolve().parent
SCENARIO = HERE / "scenarios" / "pool.toml"
MODEL = "pool"  # the one model the callers ask for
SMALL = "sim-pool-small"
# region (capmon's endpoint name) -> the simulator's model that plays it
REGIONS = {"east": "sim-pool-a", "west": "sim-pool-b", "north": "sim-pool-c"}
RPM = {"sim-pool-a": 120, "sim-pool-b": 180, "sim-pool-c": 240}  # the rpm run's quotas
MODES = ("slots", "rpm")
ITEMS = {"slots": 1200, "rpm": 900}
WORKERS = 36  # the regions' slots: the small model is needed only while one is out (or out of quota)
STRATEGIES = ("simple-shuffle", "least-busy", "usage-based-routing-v2")
# LiteLLM's best of the three for each run (benchmarks/RESULTS.md, "The pool"): its default in the
# slots run (the most throughput, the fewest failures); in the rpm run the one made for quotas,
# which keeps them (simple-shuffle takes rpm as a weight only and sends past it).
BEST_STRATEGY = {"slots": "simple-shuffle", "rpm": "usage-based-routing-v2"}
PEERS = ("capmon-room", "capmon-order", "litellm")
# The simulator's counters over a run: (its clock, model -> (requests, in flight, slots)).
Samples = list[tuple[float, dict[str, tuple[int, int, int]]]]


def quotas(mode: str) -> dict[str, int]:
    """Per simulator model, its requests-per-minute quota in ``mode`` (none in ``slots``)."""
    return dict(RPM) if mode == "rpm" else {}


def capmon_head(base_url: str, mode: str, spread: Spread) -> str:
    """The endpoints and models of capmon's config: three regions of one model, and the small one."""
    rpm = quotas(mode)
    lines = []
    for name in (*REGIONS, "small"):
        lines += [
            "[[endpoints]]",
            f'name = "{name}"',
            f'base_url = "{base_url}"',
            "simulated = true",
            'keys = [{ env = "CAPMON_BENCH_KEY", alias = "bench" }]',
            "",
        ]
    deployments = ", ".join(
        f'{{ endpoint = "{ep}", model = "{sim}"' + (f", rpm = {rpm[sim]}" if sim in rpm else "") + " }"
        for ep, sim in REGIONS.items()
    )
    lines += [
        "[[models]]",
        f'name = "{MODEL}"',
        f"deployments = [{deployments}]",
        f'spread = "{spread.value}"',
        "max_tokens = 512",
        "",
        "[[models]]",
        f'name = "{SMALL}"',
        'endpoints = ["small"]',
        "context_window = 16000",
        "max_tokens = 512",
        "",
    ]
    return "\n".join(lines)


def capmon_config(base_url: str, mode: str, spread: Spread, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """capmon-bench.toml's [client], [backoff], [breaker] and [limiter] on the pool's models
    (``overrides``: ``section.key=value``, as ``--capmon-set`` gives them)."""
    return bench_config(base_url, overrides, head=capmon_head(base_url, mode, spread))


def litellm_model_list(base_url: str, mode: str) -> list[dict[str, Any]]:
    """LiteLLM's ``model_list``: the three regions under one ``model_name``, the small model apart."""
    rpm = quotas(mode)

    def params(sim: str) -> dict[str, Any]:
        p: dict[str, Any] = {"model": f"openai/{sim}", "api_base": base_url, "api_key": KEY, "max_retries": 0}
        if sim in rpm:
            p["rpm"] = rpm[sim]
        return p

    pool = [{"model_name": MODEL, "litellm_params": params(sim)} for sim in REGIONS.values()]
    return [*pool, {"model_name": SMALL, "litellm_params": params(SMALL)}]


class CapmonPool:
    """capmon's FallbackClient on the pool; an item's answer names the region that served it."""

    def __init__(self, config: Config) -> None:
        self.client = FallbackClient(config, environ={})
        self.moved = 0
        self.fallbacks = 0

    async def __aenter__(self) -> CapmonPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()

    async def call(self, item: Item) -> str:
        r = await self.client.chat(Request.of(item.messages, item_id=str(item.index)))
        self.fallbacks += r.fallbacks
        return r.deployment

    def extra(self) -> dict[str, Any]:
        limits = {t.deployment: round(t.state.view().limiter.limit, 1) for t in self.client.targets}
        return {"fallbacks": self.fallbacks, "limits": limits}


class LiteLLMPool:
    """LiteLLM's Router on the pool (imported only here: the optional ``bench`` extra)."""

    def __init__(self, base_url: str, mode: str, strategy: str) -> None:
        import os

        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        os.environ.setdefault("LITELLM_LOG", "ERROR")
        import litellm
        from litellm import Router

        from benchmarks.peers.litellm_router import ALLOWED_FAILS, COOLDOWN, NUM_RETRIES

        litellm.telemetry = False
        litellm.suppress_debug_info = True
        self.router = Router(
            model_list=litellm_model_list(base_url, mode),
            fallbacks=[{MODEL: [SMALL]}],
            routing_strategy=strategy,
            num_retries=NUM_RETRIES,
            allowed_fails=ALLOWED_FAILS,
            cooldown_time=COOLDOWN,
            timeout=60.0,
        )

    async def __aenter__(self) -> LiteLLMPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def call(self, item: Item) -> str:
        r = await self.router.acompletion(model=MODEL, messages=item.messages)
        served = str(getattr(r, "model", "") or "")
        return served.split("/", 1)[-1]

    def extra(self) -> dict[str, Any]:
        return {}


class Counters:
    """The simulator's per-model counters every ``period`` seconds while a run goes."""

    def __init__(self, origin: str, period: float = 0.1) -> None:
        self.origin = origin
        self.period = period
        self.samples: Samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                s = get_json(self.origin + "/admin/stats", timeout=1.0)
            except (OSError, ValueError):
                continue
            counts = {n: (m["requests"], m["in_flight"], m["slots"]) for n, m in s["models"].items()}
            self.samples.append((s["elapsed"], counts))

    def __enter__(self) -> Counters:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)


def had_room(counts: dict[str, tuple[int, int, int]], at: float, offset: float, rpm: dict[str, int]) -> bool:
    """Whether a region had room at simulator time ``at``: two slots free (one is only the
    moment between an answer and the next request), and a request's worth of its quota
    (a bucket of ``rpm``, full at ``offset``, charged each request the region received)."""
    for sim in REGIONS.values():
        requests, in_flight, slots = counts[sim]
        if slots - in_flight < 2:
            continue
        if sim in rpm and rpm[sim] + (at - offset) * rpm[sim] / 60.0 - requests < 1.0:
            continue
        return True
    return False


def small_with_room(samples: Samples, offset: float, mode: str) -> tuple[float, dict[int, int]]:
    """The share of the small model's requests that arrived between two samples at both of
    which a region had room, and how many of those in each second of the run."""
    rpm = quotas(mode)
    total = roomy = 0
    when: dict[int, int] = {}
    for (a, before), (b, after) in zip(samples, samples[1:], strict=False):
        new = after[SMALL][0] - before[SMALL][0]
        total += new
        if new and had_room(before, a, offset, rpm) and had_room(after, b, offset, rpm):
            roomy += new
            second = int(a - offset)
            when[second] = when.get(second, 0) + new
    return (roomy / total if total else 0.0), when


def replay(oracle: Ideal, scn: Scenario, offset: float, period: float = 0.1) -> Samples:
    """An oracle's schedule as :class:`Counters` would have read it from a simulator every
    ``period`` seconds (the first reading half a period before its first request), so that
    :func:`small_with_room` measures the oracle and the peers alike."""
    sends = {m.name: [s for s in oracle.sends if s.model == m.name] for m in scn.models}  # in the order sent
    end = max((s.until for s in oracle.sends), default=offset)
    out: Samples = []
    k = 0
    while (at := offset + (k - 0.5) * period) <= end + period:
        counts = {}
        for m in scn.models:
            sent = [s for s in sends[m.name] if s.at <= at]
            counts[m.name] = (len(sent), sum(1 for s in sent if s.until > at), slots_at(m, at, scn.repeat))
        out.append((at, counts))
        k += 1
    return out


def over_quota(sent: dict[str, int], wall: float, mode: str) -> int:
    """Requests sent to a region beyond its quota over the run (a minute's worth at the start,
    refilled continuously): what a region enforcing it would have refused."""
    rpm = quotas(mode)
    return sum(max(0, sent.get(sim, 0) - int(r + wall * r / 60.0)) for sim, r in rpm.items())


def run(
    peer: str, mode: str, scn: Scenario, items: int, strategy: str, logs: Path, overrides: list[str] | None = None
) -> dict[str, Any]:
    """One peer on a fresh simulator; its figures."""
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    base_url = origin + "/v1"
    made: Any
    if peer == "litellm":
        made = LiteLLMPool(base_url, mode, strategy)
    else:
        spread = Spread.ROOM if peer == "capmon-room" else Spread.ORDER
        made = CapmonPool(capmon_config(base_url, mode, spread, overrides or []))
    ctx = PeerContext(base_url=base_url, models=(MODEL, SMALL), workers=WORKERS, items=items)
    sim = start_simulator(port, SCENARIO, logs / f"{mode}-{peer}-{strategy}.sim.log")
    try:
        offset = get_json(origin + "/admin/stats")["elapsed"]
        with Counters(origin) as counters:

            async def go() -> dict[str, Any]:
                async with made as p:
                    return await run_peer(p, ctx, 300.0)

            result = asyncio.run(go())
        stats = get_json(origin + "/admin/stats")
    finally:
        stop(sim, kill=True)
    return figures(result, stats, counters.samples, offset, scn, mode, items)


def figures(
    result: dict[str, Any],
    stats: dict[str, Any],
    samples: Samples,
    offset: float,
    scn: Scenario,
    mode: str,
    items: int,
) -> dict[str, Any]:
    rows = result["items"]
    ok = [r for r in rows if r["ok"]]
    totals = stats["totals"]
    rejected = totals["rejected"]["capacity"] + totals["rejected"]["rate_limited"]
    lat = [r["latency"] for r in ok]
    sent = {name: m["requests"] for name, m in stats["models"].items()}
    return {
        "completed": len(ok),
        "failed": len(rows) - len(ok),
        "wall": result["wall"],
        "req_item": totals["requests"] / items,
        "rej_item": rejected / items,
        "p50": percentile(lat, 0.5),
        "p99": percentile(lat, 0.99),
        "small": sum(1 for r in ok if r["model"] == SMALL) / len(ok) if ok else 0.0,
        "over_rpm": over_quota(sent, result["wall"], mode),
        "served": {name: sum(1 for r in ok if r["model"] == name) for name in (*REGIONS.values(), SMALL)},
        "extra": result.get("extra", {}),
        "offset": offset,
        **yardstick(ideal(scn, items, WORKERS, offset, rpm=quotas(mode)), result["wall"], samples, offset, mode),
    }


def yardstick(best: Ideal, wall: float, samples: Samples, offset: float, mode: str) -> dict[str, Any]:
    """The columns every row reads against the ideal (``best``), and ``small w/ room`` from
    the counters (the simulator's, or an oracle's replayed), for a row whose run took ``wall``."""
    roomy = small_with_room(samples, offset, mode)
    return {
        "ideal": best.makespan,
        "x_ideal": best.makespan / wall if wall else 0.0,
        "ideal_p50": best.p50,
        "ideal_p99": best.p99,
        "ideal_small": best.served.get(SMALL, 0) / sum(best.served.values()),
        "small_room": roomy[0],
        "small_room_when": roomy[1],
    }


# The yardsticks beside the peers (benchmarks/ideal.py): the ideal knows every region's room the
# moment it changes; the informed oracle learns of a rise (region b's return) one round trip late;
# held to [limiter] initial for its first round trip, it is the floor of a client that starts there.
def oracles(initial: int = INITIAL_LIMIT) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The oracle rows' names and how each is held (``initial``: capmon's ``[limiter] initial``)."""
    return (
        ("*ideal*", {}),
        ("*informed oracle*", {"informed": True}),
        (f"*informed, from {initial} slots*", {"informed": True, "start": initial}),
    )


def oracle_figures(
    scn: Scenario, mode: str, items: int, offset: float, how: Mapping[str, Any], best: Ideal
) -> dict[str, Any]:
    """An oracle's figures in a peer's columns (it is never refused: one request per item),
    on the scenario clock from ``offset`` (a peer's measured start, so its seconds line up);
    ``best``: the ideal's schedule from the same ``offset``."""
    o = ideal(scn, items, WORKERS, offset, rpm=quotas(mode), **how) if how else best
    return {
        "completed": items,
        "failed": 0,
        "wall": o.makespan,
        "req_item": 1.0,
        "rej_item": 0.0,
        "p50": o.p50,
        "p99": o.p99,
        "small": o.served.get(SMALL, 0) / items,
        "over_rpm": 0,
        "served": dict(o.served),
        "extra": {},
        **yardstick(best, o.makespan, replay(o, scn, offset), offset, mode),
    }


HEAD = [
    "peer",
    "x ideal",
    "wall s (ideal)",
    "req/item",
    "rej/item",
    "p50 s (ideal)",
    "p99 s (ideal)",
    "on small (ideal)",
    "small w/ room",
    "over rpm",
    "failed",
]


def row(name: str, f: dict[str, Any]) -> list[str]:
    return [
        name,
        f"{f['x_ideal']:.2f}",
        f"{f['wall']:.1f} ({f['ideal']:.1f})",
        f"{f['req_item']:.2f}",
        f"{f['rej_item']:.3f}",
        f"{f['p50']:.2f} ({f['ideal_p50']:.2f})",
        f"{f['p99']:.2f} ({f['ideal_p99']:.2f})",
        f"{f['small']:.1%} ({f['ideal_small']:.1%})",
        f"{f['small_room']:.1%}",
        str(f["over_rpm"]),
        str(f["failed"]),
    ]


def litellm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("litellm") is not None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pool", description=__doc__.split("\n\n")[0])
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: slots, rpm")
    p.add_argument("--peers", default=",".join(PEERS), help="comma-separated: " + ", ".join(PEERS))
    p.add_argument(
        "--litellm-strategy",
        default="best",
        help=f"LiteLLM's routing_strategy: one of {', '.join(STRATEGIES)}, best (each run's), or all (a row each)",
    )
    p.add_argument("--items", type=int, default=0, help="items per run (default: 1200 for slots, 900 for rpm)")
    p.add_argument("--json", default="", help="also write every figure here")
    p.add_argument(
        "--capmon-whatif",
        action="append",
        default=[],
        metavar="FILE",
        help="a benchmarks/whatif/*.py file that patches capmon's core for this run's capmon rows (repeatable)",
    )
    p.add_argument(
        "--capmon-set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of benchmarks/capmon-bench.toml for capmon's rows (repeatable); "
        "[limiter] initial also holds the floor oracle",
    )
    args = p.parse_args(argv)
    apply_whatif(args.capmon_whatif)  # capmon runs in this process; LiteLLM's rows do not use its core
    scn = load_scenario(SCENARIO)
    peers = [x for x in args.peers.split(",") if x]
    if "litellm" in peers and not litellm_available():
        print("LiteLLM is not installed (pip install -e '.[bench]', in a venv of its own): its rows are left out")
        peers.remove("litellm")
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="capmon-pool-") as tmp:
        for mode in args.modes.split(","):
            items = args.items or ITEMS[mode]
            strategies = {"all": list(STRATEGIES), "best": [BEST_STRATEGY[mode]]}.get(
                args.litellm_strategy, [args.litellm_strategy]
            )
            rows = []
            offset = 0.0
            for peer in peers:
                for strategy in strategies if peer == "litellm" else [""]:
                    name = f"litellm {strategy}" if strategy else peer
                    t0 = time.monotonic()
                    f = run(peer, mode, scn, items, strategy, Path(tmp), args.capmon_set)
                    out[f"{mode}/{name}"] = f
                    when = ", ".join(f"{s}s: {n}" for s, n in sorted(f["small_room_when"].items()))
                    print(f"  {mode} {name}: {time.monotonic() - t0:.0f}s, served {f['served']} {f['extra']}")
                    print(f"    to the small model with room, by second of the run: {when or 'none'}")
                    rows.append(row(name, f))
                    offset = offset or f["offset"]
            initial = capmon_config("http://127.0.0.1/v1", mode, Spread.ROOM, args.capmon_set).limiter.initial
            best = ideal(scn, items, WORKERS, offset, rpm=quotas(mode))
            for name, how in oracles(initial):
                f = oracle_figures(scn, mode, items, offset, how, best)
                out[f"{mode}/{name}"] = f
                when = ", ".join(f"{s}s: {n}" for s, n in sorted(f["small_room_when"].items()))
                print(f"  {mode} {name}: to the small model with room, by second: {when or 'none'}")
                rows.append(row(name, f))
            print(f"\n{mode}: {items} items, {WORKERS} workers\n")
            print(markdown_table(HEAD, rows) + "\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
