"""The ``perdure`` command line.

Only ``worker`` and ``start`` import user code (``MODULE:APP``); every other
command works from the store alone, through a :class:`~perdure.client.Client`.
Commands that take a run id find the run's app in the store, so ``--app`` is
only needed to list runs or waits.

Exit codes: 0 done; 1 refused (the request was understood and the engine said
no: a settled or expired wait, a finished run, a cancel that took no effect, a
``start --wait`` whose run did not succeed); 2 bad input (malformed arguments
or JSON, an unknown run or workflow, an unusable store, a module that does not
import); 3 an unexpected internal error. Errors print one line on stderr;
``PERDURE_DEBUG=1`` adds the traceback of an internal error.
"""

from __future__ import annotations

import click

from perdure.cli import admin, console, delivery, operations, plumbing, user_code

# The public names of the module this package replaced, still importable from here.
EXIT_OK = console.EXIT_OK
EXIT_REFUSED = console.EXIT_REFUSED
EXIT_BAD_INPUT = console.EXIT_BAD_INPUT
EXIT_INTERNAL = console.EXIT_INTERNAL
Fail = console.Fail
JsonValue = plumbing.JsonValue
worker = user_code.worker
start = user_code.start
runs = operations.runs
show = operations.show
signal = delivery.signal
send = delivery.send
waits = delivery.waits
resume = delivery.resume
cancel = operations.cancel
resolve = operations.resolve
fork = operations.fork
migrate = admin.migrate
demo = admin.demo


# -- commands -------------------------------------------------------------------


@click.group(
    cls=console._Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit status: 0 done, 1 refused, 2 bad input, 3 internal error.",
)
@click.version_option(package_name="perdure", prog_name="perdure")
def cli() -> None:
    """perdure: durable workflows for plain Python, on SQLite or PostgreSQL."""


# --help lists the commands in the order they are added.
cli.add_command(worker)
cli.add_command(start)
cli.add_command(runs)
cli.add_command(show)
cli.add_command(signal)
cli.add_command(send)
cli.add_command(waits)
cli.add_command(resume)
cli.add_command(cancel)
cli.add_command(resolve)
cli.add_command(fork)
cli.add_command(migrate)
cli.add_command(demo)


def main() -> None:
    """Entry point of the ``perdure`` console script and ``python -m perdure``."""
    cli.main(prog_name="perdure")
