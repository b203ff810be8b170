"""One store write in a loop, for comparing two trees: ``finish_step`` on SQLite.

Claims one run on a fresh SQLite file and records N steps on it one by one,
each with its two receipts (``step_started``, ``step_completed``), as a
worker's step does. Prints wall time, process CPU and user CPU per call; user
CPU leaves out the kernel's share of the commit (the WAL write and fsync),
so it shows what the statements and the Python around them cost. Run it
against two checkouts in alternation::

    PYTHONPATH=$BEFORE/src .venv/bin/python bench/finish_step_cpu.py 3000
    PYTHONPATH=src .venv/bin/python bench/finish_step_cpu.py 3000
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time

from perdure.store import port
from perdure.store.sqlite import store as sqlite


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    path = f"{tempfile.mkdtemp()}/bench.db"
    store = sqlite.SqliteStore(f"sqlite:///{path}", ledger_limit=1_000_000)
    store.migrate()
    store.create_run(port.NewRun("r1", "bench", "w", "1", input="{}"))
    (claimed,) = store.claim("bench", "w1", [("w", "1")], lease_ttl=600)
    marks = [port.Mark("step_started", step="noop"), port.Mark("step_completed", step="noop")]
    wall, cpu = time.perf_counter(), time.process_time()
    user = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    for i in range(1, count + 1):
        entry = port.JournalEntry(i, "step", "noop", "ok", output=str(i))
        store.finish_step(claimed.claim, [entry], marks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    user = resource.getrusage(resource.RUSAGE_SELF).ru_utime - user
    store.close()
    per = 1e6 / count
    print(f"finish_step wall_us {wall * per:.1f} cpu_us {cpu * per:.1f} user_us {user * per:.1f}")


if __name__ == "__main__":
    main()
