"""Encrypted payloads: the database never holds a run's inputs, outputs or signals in plaintext.

Every payload is sealed with Fernet before it is stored, on the client that
starts the run and signals it and on the worker that runs it. Keys come from
``$ENCRYPTION_KEYS`` (comma-separated, newest first: rotate by putting a new
key in front), the store from ``$PERDURE_STORE``::

    export ENCRYPTION_KEYS=$(python -c \
        "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())")
    export PERDURE_STORE=sqlite:///encrypted.db
    python encrypted.py start Ada 1234        # prints the run id
    perdure worker encrypted:app &
    python encrypted.py confirm RUN_ID
    perdure show RUN_ID --journal       # ciphertext
    perdure --codec encrypted:app show RUN_ID --journal   # plaintext
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import perdure

KEYS = [key for key in os.environ.get("ENCRYPTION_KEYS", "").split(",") if key]
if not KEYS:
    raise SystemExit("set ENCRYPTION_KEYS to one or more Fernet keys, newest first")

app = perdure.App(name="encryption", codec=perdure.FernetCodec(KEYS))


@app.step()
def greet(name: str) -> str:
    return f"Hello, {name}"


@app.step()
def compose(greeting: str, code: str) -> str:
    _checkpoint()
    return f"{greeting}! Your code is {code}."


@app.workflow()
def encrypted_greeting(ctx: perdure.Context, name: str, code: str) -> dict[str, Any]:
    greeting = greet(name)
    confirmation = ctx.wait("confirm")
    message = compose(greeting, code)
    return {"message": message, "confirmed_by": confirmation["by"]}


def _checkpoint() -> None:
    """Let a test stop a worker inside ``compose`` (``$ENCRYPTION_PAUSE_DIR``)."""
    where = os.environ.get("ENCRYPTION_PAUSE_DIR")
    if not where:
        return
    (Path(where) / "reached").touch()
    while not (Path(where) / "release").exists():
        time.sleep(0.02)


if __name__ == "__main__":
    command, *rest = sys.argv[1:] or ["help"]
    if command == "start":
        print(app.start(encrypted_greeting, rest[0], rest[1]).run_id)
    elif command == "confirm":
        print(app.signal(rest[0], "confirm", {"by": os.environ.get("USER", "someone")}))
    else:
        print(__doc__)
