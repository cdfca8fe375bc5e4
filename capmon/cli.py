"""capmon's command line: the dashboard, batch jobs, the simulator, reports, status.

This is the only module that reads arguments: each command turns its flags into
typed options (frozen dataclasses) and calls a function that knows nothing of
argparse; errors become one line on stderr and an exit code (capmon/exitcodes.py).
Each command imports what it needs when it runs, so ``capmon sim`` never loads
Textual and ``capmon batch`` works on a machine with no terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from capmon import __version__
from capmon.batch.defaults import DEFAULT_CONCURRENCY
from capmon.core.types.config import DEFAULT_LISTEN, DashboardConfig, SimulatorConfig
from capmon.exitcodes import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

if TYPE_CHECKING:
    from capmon.batch.store import Db
    from capmon.connect import ConnectOptions


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="PATH",
        help="config file (default: $CAPMON_CONFIG, ./config.toml, the user config, the bundled demo)",
    )


def _add_connect(p: argparse.ArgumentParser, what: str, admin_for: str) -> None:
    from capmon.connect import DEFAULT_ADMIN_KEY_ENV, DEFAULT_KEY_ENV

    p.add_argument("--connect", metavar="URL", help=f"{what} of a running gateway (`capmon serve`) at http://HOST:PORT")
    p.add_argument(
        "--key-env",
        metavar="NAME",
        help=f"with --connect: the variable holding a client key of the gateway (default {DEFAULT_KEY_ENV})",
    )
    p.add_argument(
        "--admin-key-env",
        metavar="NAME",
        help=f"with --connect: the variable holding the gateway's admin key, {admin_for} "
        f"(default {DEFAULT_ADMIN_KEY_ENV})",
    )


def _connect_options(args: argparse.Namespace, others: Sequence[tuple[str, object]]) -> ConnectOptions | None:
    """The --connect options, or None without --connect; the flags that make no sense with
    it (the gateway has its own config and traffic) are refused."""
    from capmon.connect import ConnectOptions
    from capmon.core.base.exceptions import CapmonError

    if args.connect is None:
        for flag in ("--key-env", "--admin-key-env"):
            if getattr(args, flag[2:].replace("-", "_")) is not None:
                raise CapmonError(f"{flag} goes with --connect URL (the keys of a gateway)")
        return None
    given = [flag for flag, value in others if value]
    if given:
        raise CapmonError(
            f"{', '.join(given)} cannot go with --connect: the gateway runs on its own config and "
            f"serves its own clients"
        )
    return ConnectOptions(url=args.connect, key_env=args.key_env, admin_key_env=args.admin_key_env)


def _add_job_checks(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--accept-changed-input",
        action="store_true",
        help="the input changed since the job was created: take it (new lines added, removed ones marked "
        "removed, changed ones sent again)",
    )
    p.add_argument(
        "--remap",
        action="append",
        metavar="OLD=NEW",
        help="send items that name model OLD (gone from the config) to NEW; repeatable, remembered by the job",
    )
    p.add_argument(
        "--lease-ttl",
        type=float,
        metavar="SECONDS",
        help="a job in PostgreSQL: how long a worker that died keeps its items from the others (default 30)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="send items as streams, so an answer that breaks mid-way is continued by the next model "
        "([client] continuations) instead of sent again from its start",
    )
    p.add_argument(
        "--max-cost",
        type=float,
        metavar="USD",
        help="pause the job once its answers cost this much at the config's [[models]] prices (its earlier runs "
        "included; the items in flight finish); resume --max-cost raises it; remembered by the job",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="capmon",
        description="Keep LLM API work running when models are at capacity. With no command: the live dashboard.",
    )
    parser.add_argument("--version", action="version", version=f"capmon {__version__}")
    _add_config(parser)
    parser.add_argument(
        "--refresh",
        type=float,
        metavar="SECONDS",
        help=f"seconds between table refreshes (default from config: {DashboardConfig.refresh:g})",
    )
    parser.add_argument("--readonly", action="store_true", help="hide manual trip / reset / pin")
    traffic = parser.add_mutually_exclusive_group()
    traffic.add_argument(
        "--job", metavar="INPUT.jsonl", help="run this batch file as the traffic worker instead of the demo job"
    )
    traffic.add_argument("--attach", metavar="JOB", help="show a job started with `capmon batch run` (by name)")
    parser.add_argument("--no-traffic", action="store_true", help="probes only: run no traffic worker")
    _add_connect(parser, "watch and steer the client", "needed to trip, reset and pin (without it: read-only)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    sim = sub.add_parser("sim", help="serve the simulated provider")
    sim.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_LISTEN}; port 0: a free one)",
    )
    sim.add_argument(
        "--scenario",
        default=SimulatorConfig.scenario,
        metavar="NAME|PATH",
        help=f"a bundled scenario (--list shows them) or a scenario TOML file (default {SimulatorConfig.scenario})",
    )
    sim.add_argument("--list", action="store_true", help="list the bundled scenarios and exit")
    sim.add_argument("--access-log", action="store_true", help="log every request")
    sim.add_argument(
        "--admin-key-env",
        metavar="NAME",
        help="variable holding the /admin key (default CAPMON_SIM_ADMIN_KEY); needed beyond loopback",
    )
    sim.add_argument("--open-admin", action="store_true", help="listen beyond loopback with /admin open to anyone")

    gateway = sub.add_parser("serve", help="the OpenAI-compatible gateway in front of one shared fallback client")
    _add_config(gateway)
    gateway.add_argument(
        "--listen", metavar="HOST:PORT", help="where to listen (default from config [gateway] listen: 127.0.0.1:4000)"
    )
    gateway.add_argument(
        "--access-log",
        metavar="PATH",
        help="one JSON line per request to PATH (appended; - for stderr); default from config [gateway] access_log",
    )
    gateway.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="N processes on the port, one client through [shared] redis (default [gateway] workers: 1)",
    )
    gateway.add_argument(
        "--loop", choices=("asyncio", "uvloop"), help="the event loop (default [gateway] loop: asyncio)"
    )
    gateway.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # set by the supervisor in its workers
    gateway.add_argument("--standby", action="store_true", help=argparse.SUPPRESS)  # the supervisor's spare worker

    status = sub.add_parser("status", help="print the client's snapshot without the dashboard")
    _add_config(status)
    status.add_argument("--once", action="store_true", help="print one snapshot and exit")
    status.add_argument("--json", action="store_true", help="as JSON")
    status.add_argument("--probe", action="store_true", help="probe every model once before printing")
    _add_connect(status, "the snapshot", "sent for reads when set")

    batch = sub.add_parser("batch", help="durable batch jobs")
    bsub = batch.add_subparsers(dest="batch_command", metavar="ACTION", required=True)
    run = bsub.add_parser("run", help="run (or resume) a JSONL batch")
    _add_config(run)
    run.add_argument("input", metavar="INPUT.jsonl")
    run.add_argument("--out", metavar="OUT.jsonl", help="write results here when the job finishes")
    run.add_argument("--job", metavar="NAME", help="job name (default: the input file's stem)")
    run.add_argument(
        "--concurrency", type=int, metavar="N", help=f"items in flight at once (default {DEFAULT_CONCURRENCY})"
    )
    run.add_argument("--rate", type=float, metavar="R", help="at most R items started per second")
    run.add_argument("--window", metavar="HH:MM-HH:MM", help="send only inside this daily window (local time)")
    _add_db(run)
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_job_checks(run)
    resume = bsub.add_parser("resume", help="go on with a stopped job")
    _add_config(resume)
    resume.add_argument("job", metavar="JOB")
    resume.add_argument("--out", metavar="OUT.jsonl")
    resume.add_argument("--concurrency", type=int, metavar="N")
    resume.add_argument("--rate", type=float, metavar="R")
    resume.add_argument("--window", metavar="HH:MM-HH:MM")
    _add_db(resume)
    resume.add_argument("--no-progress", action="store_true")
    _add_job_checks(resume)
    export = bsub.add_parser("export", help="write a job's results in input order")
    export.add_argument("job", metavar="JOB")
    export.add_argument("--out", metavar="OUT.jsonl", required=True)
    _add_db(export)
    compare = bsub.add_parser(
        "compare", help="send a sample of the items a fallback served to their preferred model, and compare"
    )
    _add_config(compare)
    compare.add_argument("job", metavar="JOB")
    compare.add_argument("--sample", type=int, default=20, metavar="N", help="items to send again (default 20)")
    compare.add_argument("--seed", type=int, default=0, help="the sample's seed: the same seed, the same items")
    _add_db(compare)
    lst = bsub.add_parser("list", help="list jobs")
    _add_db(lst)
    show = bsub.add_parser("show", help="one job's state")
    show.add_argument("job", metavar="JOB")
    _add_db(show)

    report = sub.add_parser("report", help="what happened in a job: models, errors, fallbacks, latency")
    report.add_argument("job", metavar="JOB")
    _add_db(report)
    fmt = report.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--csv", action="store_true")
    report.add_argument("--advice", action="store_true", help="say what to change, from the audit trail")
    report.add_argument("--item", metavar="ID", help="one item: every attempt, and why it fell back")
    _add_config(report)
    return parser


def _run_sim(args: argparse.Namespace) -> int:
    from capmon.sim.command import SimOptions, run_sim

    return run_sim(
        SimOptions(
            listen=args.listen,
            scenario=args.scenario,
            access_log=args.access_log,
            admin_key_env=args.admin_key_env,
            open_admin=args.open_admin,
            list_scenarios=args.list,
        )
    )


def _run_serve(args: argparse.Namespace) -> int:
    from capmon.core.base.extras import Extra, require

    require(Extra.GATEWAY, "capmon serve")  # before importing the gateway, which imports them all
    from capmon.gateway.serve import ServeOptions, serve

    return serve(
        ServeOptions(
            listen=args.listen,
            config=args.config,
            access_log=args.access_log,
            workers=args.workers,
            loop=args.loop,
            worker=args.worker,
            standby=args.standby,
        )
    )


def _run_status(args: argparse.Namespace) -> int:
    from capmon.status import StatusOptions, run_status

    # --once is the only mode there is: the flag stays so that scripts may say so.
    connect = _connect_options(args, ())
    return run_status(StatusOptions(config=args.config, json=args.json, probe=args.probe, connect=connect))


def _add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="PATH|URL",
        help="job store: a SQLite file, or postgresql://USER@HOST:PORT/DB (no password here) to share a job "
        "among many workers (default: $CAPMON_DB or the user data dir)",
    )
    parser.add_argument(
        "--db-url-env", metavar="NAME", help="environment variable holding the PostgreSQL URL (one with a password)"
    )


def _db(args: argparse.Namespace) -> Db:
    """The job store the flags name."""
    from capmon.batch.store import locate

    return locate(args.db or None, url_env=args.db_url_env)


def _run_batch(args: argparse.Namespace) -> int:
    from capmon.batch import commands as c
    from capmon.batch.options import parse_remap

    action = args.batch_command
    with _flags():
        db = _db(args)
        if action in ("run", "resume"):
            from capmon.batch.spend_cap import check_max_cost

            check_max_cost(args.max_cost)
            start = {
                "out": args.out,
                "concurrency": args.concurrency,
                "rate": args.rate,
                "window": args.window,
                "db": db,
                "config": args.config,
                "show_progress": not args.no_progress,
                "accept_changed_input": args.accept_changed_input,
                "remap": parse_remap(args.remap or ()),
                "lease_ttl": args.lease_ttl,
                "stream": args.stream,
                "max_cost": args.max_cost,
            }
            if action == "run":
                return c.run_job(c.RunOptions(input=Path(args.input), job=args.job, **start))
            return c.resume_job(c.ResumeOptions(job=args.job, **start))
        if action == "export":
            return c.export_command(db, args.job, args.out)
        if action == "compare":
            return c.compare_command(db, args.job, args.sample, args.seed, args.config)
        if action == "list":
            return c.list_jobs(db)
        return c.show_job(db, args.job)


def _run_report(args: argparse.Namespace) -> int:
    from capmon.report import OutputFormat, ReportOptions, run_report

    fmt = OutputFormat.JSON if args.json else OutputFormat.CSV if args.csv else OutputFormat.TEXT
    with _flags():
        db = _db(args)
    options = ReportOptions(job=args.job, db=db, format=fmt, advice=args.advice, item=args.item, config=args.config)
    return run_report(options)


@contextlib.contextmanager
def _flags() -> Iterator[None]:
    """An option's error as the command line says it, naming the flag (``concurrency: ...``
    is reported as ``--concurrency: ...``)."""
    from capmon.batch.options import OptionError
    from capmon.core.base.exceptions import CapmonError

    try:
        yield
    except OptionError as e:
        flag = "--" + e.option.replace("_", "-")
        raise CapmonError(f"{flag}{'' if e.value is None else ' ' + e.value}: {e.detail}") from None


def _run_dashboard(args: argparse.Namespace) -> int:
    connect = _connect_options(
        args,
        (("--config", args.config), ("--job", args.job), ("--attach", args.attach), ("--no-traffic", args.no_traffic)),
    )
    if connect is not None:
        if not sys.stdout.isatty():  # as below: the gateway's snapshot instead of drawing
            from capmon.status import StatusOptions, run_status

            return run_status(StatusOptions(connect=connect))
        from capmon.tui.remote import RemoteDashboardOptions, run_remote_dashboard

        return run_remote_dashboard(
            RemoteDashboardOptions(connect=connect, refresh=args.refresh, readonly=args.readonly)
        )
    if not sys.stdout.isatty() and args.attach:
        # Not a terminal: the attached job's status, as `capmon batch show` prints it.
        from capmon.batch.commands import show_job

        return show_job(None, args.attach)
    if not sys.stdout.isatty():
        # Not a terminal (a pipe, a file, CI): print the snapshot instead of drawing.
        from capmon.status import StatusOptions, run_status

        return run_status(StatusOptions(config=args.config, probe=True))
    from capmon.tui.app import DashboardOptions, run_dashboard

    return run_dashboard(
        DashboardOptions(
            config=args.config,
            refresh=args.refresh,
            readonly=args.readonly,
            job=None if args.job is None else Path(args.job),
            attach=args.attach,
            traffic=not args.no_traffic,
        )
    )


COMMANDS: dict[str | None, Callable[[argparse.Namespace], int]] = {
    None: _run_dashboard,
    "sim": _run_sim,
    "serve": _run_serve,
    "status": _run_status,
    "batch": _run_batch,
    "report": _run_report,
}


def main(argv: Sequence[str] | None = None) -> int:
    from capmon.core.base.exceptions import CapmonError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except CapmonError as e:
        print(f"capmon: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `capmon status --json | head`
        sys.stderr.close()
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
