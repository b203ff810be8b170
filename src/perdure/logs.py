"""Log lines about runs, in text or as one JSON object per line.

Every worker line about a run goes through a :class:`RunLog`, which names the
run, its app and workflow (and the step and attempt when there is one) in
the text and as record attributes, so :class:`JsonFormatter` can emit them
as fields. ``perdure worker --log-format json`` installs that formatter.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal

# The record attributes a run's log line carries, in the order JSON emits them.
FIELDS = ("run_id", "app", "workflow", "version", "step", "attempt", "worker_id")

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class RunLog:
    """A logger bound to one run: each line names it and carries its fields."""

    def __init__(
        self, logger: logging.Logger, run_id: str, app: str, workflow: str, version: str
    ) -> None:
        self.logger = logger
        self.fields: dict[str, Any] = {
            "run_id": run_id,
            "app": app,
            "workflow": workflow,
            "version": version,
        }
        self.prefix = f"run {run_id} (app {app}, workflow {workflow} v{version})"

    def log(
        self,
        level: int,
        message: str,
        *args: Any,
        step: str | None = None,
        attempt: int | None = None,
        exc_info: bool = False,
    ) -> None:
        """Log ``message % args`` about the run (and ``step``'s ``attempt``, when given)."""
        if not self.logger.isEnabledFor(level):
            return
        extra = dict(self.fields)
        where = self.prefix
        if step is not None:
            extra["step"] = step
            where = f"{where[:-1]}, step {step}"
            if attempt is not None:
                extra["attempt"] = attempt
                where += f", attempt {attempt}"
            where += ")"
        self.logger.log(level, f"{where}: {message}", *args, extra=extra, exc_info=exc_info)

    def info(self, message: str, *args: Any, **kw: Any) -> None:
        self.log(logging.INFO, message, *args, **kw)

    def warning(self, message: str, *args: Any, **kw: Any) -> None:
        self.log(logging.WARNING, message, *args, **kw)

    def error(self, message: str, *args: Any, **kw: Any) -> None:
        self.log(logging.ERROR, message, *args, **kw)


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON object: ts, level, logger, message and the run's fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def configure(log_format: LogFormat = "text", level: int = logging.INFO) -> logging.Handler:
    """Send log records to stderr in ``log_format`` (replacing the root's handlers)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
