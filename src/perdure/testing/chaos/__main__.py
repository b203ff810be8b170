"""``python -m perdure.testing.chaos [MODULE:SCENARIO ...] [--long] [--store URL] [--json]``.

And the soaks on PostgreSQL (:mod:`perdure.testing.chaos.soak`)::

    python -m perdure.testing.chaos soak --store postgresql://... [--workers N] [--long]
    python -m perdure.testing.chaos network --store postgresql://... [--workers N] [--long]

Exit status: 0 no violation, 1 violations, 2 bad input (an unknown scenario,
mode or store URL).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Sequence

from perdure import errors
from perdure.testing.chaos import explorer, trial
from perdure.testing.chaos import scenario as scenario_api


def load(spec: str) -> list[scenario_api.Scenario]:
    """Return the scenarios ``module:name`` names (a Scenario or a sequence of them).

    Raises:
        errors.ImportFailed: the module or the name cannot be found, or names
            no scenario.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise errors.ImportFailed(f"a scenario is named MODULE:NAME, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise errors.ImportFailed(f"cannot import {module_name!r}: {exc}") from exc
    found = getattr(module, attribute, None)
    if isinstance(found, scenario_api.Scenario):
        return [found]
    if (
        isinstance(found, (list, tuple))
        and found
        and all(isinstance(s, scenario_api.Scenario) for s in found)
    ):
        return list(found)
    raise errors.ImportFailed(f"{spec!r} names no perdure.testing.chaos.Scenario")


def parser() -> argparse.ArgumentParser:
    """Return the command line's parser."""
    p = argparse.ArgumentParser(
        prog="python -m perdure.testing.chaos",
        description="Crash a process at every store write of each scenario; check what survives.",
    )
    p.add_argument(
        "scenarios",
        nargs="*",
        metavar="MODULE:SCENARIO",
        help="scenarios to explore (default: the built-in ones)",
    )
    p.add_argument(
        "--store",
        help="sqlite:///path/dir/x.db (trial stores go in its folder) "
        "or a PostgreSQL server URL (default: a temporary SQLite folder)",
    )
    p.add_argument("--long", action="store_true", help="every site of every mode")
    p.add_argument(
        "--sites",
        type=int,
        default=explorer.SHORT_SITES,
        help=f"short form: sites per scenario and mode (default {explorer.SHORT_SITES})",
    )
    p.add_argument(
        "--mode",
        action="append",
        choices=trial.MODES,
        help="only this mode (repeatable; default: all)",
    )
    p.add_argument("--seed", type=int, default=0, help="the seed of the site sample (default 0)")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a trial's process may take (default 60)",
    )
    p.add_argument("--keep", help="copy the folders of trials with violations here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def soak_parser(kind: str) -> argparse.ArgumentParser:
    """Return the parser of ``soak`` (kill -9) or ``network`` (broken connections)."""
    what = {
        "soak": "SIGKILL random worker processes every few hundred ms",
        "network": "break the workers' connections through a faulty proxy",
    }[kind]
    p = argparse.ArgumentParser(
        prog=f"python -m perdure.testing.chaos {kind}",
        description=f"Serve runs with real workers on PostgreSQL, {what}; check what survives.",
    )
    p.add_argument("--store", required=True, help="a PostgreSQL server URL (a database is made)")
    p.add_argument("--long", action="store_true", help="8 workers, 400 runs, 3 minutes of faults")
    p.add_argument("--workers", type=int, help="worker processes (default 3, long 8)")
    p.add_argument("--runs", type=int, help="runs started (default 36, long 400)")
    p.add_argument("--seconds", type=float, help="seconds of faults (default 20, long 180)")
    p.add_argument("--seed", type=int, default=0, help="the seed of the fault schedule")
    p.add_argument("--keep", help="keep the side records and worker logs in this folder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main_soak(kind: str, argv: Sequence[str]) -> int:
    """Run one soak; return the exit status."""
    from perdure.testing.chaos import soak

    args = soak_parser(kind).parse_args(argv)
    try:
        report = soak.soak(
            args.store,
            "kill" if kind == "soak" else "network",
            long=args.long,
            workers=args.workers,
            runs=args.runs,
            seconds=args.seconds,
            seed=args.seed,
            keep=args.keep,
            progress=None if args.json else lambda line: print(line, file=sys.stderr, flush=True),
        )
    except errors.PerdureError as exc:
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json(), indent=2) if args.json else report.table())
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the explorer, or a soak; return the exit status."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in ("soak", "network"):
        return main_soak(given[0], given[1:])
    args = parser().parse_args(given)
    try:
        chosen = [s for spec in args.scenarios for s in load(spec)]
        if not args.scenarios:
            from perdure.testing.chaos import scenarios

            chosen = list(scenarios.BUILT_IN)
        if args.sites < 1:
            raise errors.InvalidInput(f"--sites must be at least 1, got {args.sites}")
        with tempfile.TemporaryDirectory(prefix="perdure-chaos-") as scratch:
            url = args.store or f"sqlite:///{scratch}/chaos.db"
            if not url.startswith(("sqlite:///", "postgresql://", "postgres://")):
                raise errors.InvalidStoreURL(
                    f"--store must be a sqlite:/// or postgresql:// URL, got {url!r}"
                )
            report = explorer.explore(
                chosen,
                url,
                long=args.long,
                sites=args.sites,
                modes=args.mode or trial.MODES,
                seed=args.seed,
                timeout=args.timeout,
                keep=args.keep,
                progress=None
                if args.json
                else lambda line: print(line, file=sys.stderr, flush=True),
            )
    except errors.PerdureError as exc:
        print(f"error: {exc.code}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.table())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
