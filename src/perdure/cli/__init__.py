"""The ``perdure`` command line.

One module per command group: ``workers`` (worker), ``runs`` (start, runs,
show), ``tasks`` (a plan run's tasks), ``signals`` (signal, send, waits,
resume), ``live`` (update, query, events, stream), ``operators`` (cancel,
resolve, fork), ``retention`` (prune), ``schedules`` (schedules, pause,
resume, trigger), ``queues``, ``migrate``, ``demo``, ``deploys`` (check),
``tokens`` and ``console`` (the web console, an optional extra); ``common``
and ``output`` hold what they share. Only ``worker``, ``start``, ``check``
and ``query`` (and ``update --validate``) import user code (``MODULE:APP``),
and ``runs`` and ``waits`` when given one; every other command works from the store alone,
through a :class:`~perdure.client.Client`. Commands that take a run id find
the run's app in the store; ``runs`` and ``waits`` list every app unless told
one.

Exit codes: 0 done; 1 refused (the request was understood and the engine said
no: a settled or expired wait, a finished run, a cancel that took no effect, a
``start --wait`` whose run did not succeed); 2 bad input (malformed arguments
or JSON, an unknown run or workflow, an unusable store, a module that does not
import); 3 an unexpected internal error. Errors print one line on stderr;
``PERDURE_DEBUG=1`` adds the traceback of an internal error.
"""

from __future__ import annotations

import click

from perdure.cli import (
    common,
    console,
    demo,
    deploys,
    live,
    migrate,
    operators,
    output,
    queues,
    retention,
    runs,
    schedules,
    signals,
    tasks,
    tokens,
    workers,
)


@click.group(
    cls=output.Group,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit status: 0 done, 1 refused, 2 bad input, 3 internal error.",
)
@click.version_option(package_name="perdure", prog_name="perdure")
@click.option("--codec", "codec_target", metavar="MODULE:OBJ", default=None, help=common.CODEC_HELP)
@click.pass_context
def cli(ctx: click.Context, codec_target: str | None) -> None:
    """perdure: durable workflows for plain Python, on SQLite or PostgreSQL."""
    ctx.meta["perdure.codec"] = codec_target


# --help lists the commands in the order they are added.
for command in (
    workers.worker,
    runs.start,
    runs.runs,
    runs.show,
    tasks.tasks,
    signals.signal,
    signals.send,
    signals.waits,
    signals.resume,
    live.update,
    live.query,
    live.events,
    live.stream,
    operators.cancel,
    operators.suspend,
    operators.resolve,
    operators.fork,
    retention.prune,
    schedules.schedules_,
    queues.queues_,
    migrate.migrate,
    demo.demo,
    tokens.tokens,
    console.console,
    deploys.check,
):
    cli.add_command(command)


def main() -> None:
    """Entry point of the ``perdure`` console script and ``python -m perdure``."""
    cli.main(prog_name="perdure")
