"""``python -m capmon.sim --listen 127.0.0.1:8089 --scenario demo``"""

from __future__ import annotations

import argparse
import sys

from capmon.core.exceptions import CapmonError


def main(argv: list[str] | None = None) -> int:
    from capmon.sim.scenario import bundled_scenarios

    parser = argparse.ArgumentParser(
        prog="python -m capmon.sim", description="Run capmon's simulated OpenAI-compatible provider."
    )
    parser.add_argument("--listen", default="127.0.0.1:8089", help="HOST:PORT (default 127.0.0.1:8089)")
    parser.add_argument(
        "--scenario", default="demo", help=f"a bundled scenario ({', '.join(bundled_scenarios())}) or a path to a TOML"
    )
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.add_argument(
        "--admin-key-env",
        metavar="NAME",
        help="environment variable holding the /admin key (default CAPMON_SIM_ADMIN_KEY); "
        "required to listen beyond loopback",
    )
    parser.add_argument(
        "--open-admin", action="store_true", help="listen beyond loopback with /admin open to anyone who can reach it"
    )
    parser.add_argument("--list", action="store_true", help="list the bundled scenarios and exit")
    args = parser.parse_args(argv)
    if args.list:
        from capmon.sim.scenario import load_scenario

        for name in bundled_scenarios():
            print(f"{name:12} {load_scenario(name).description}")
        return 0
    from capmon.sim.server import serve

    try:
        serve(
            args.listen,
            args.scenario,
            access_log=args.access_log,
            admin_key_env=args.admin_key_env,
            open_admin=args.open_admin,
        )
    except CapmonError as e:
        print(f"capmon sim: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
