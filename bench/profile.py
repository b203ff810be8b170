"""Profile one workload with py-spy and say where the time goes, per thread role.

    bench/.venv/bin/python bench/profile.py W1 sqlite [--engine perdure] [--gil] [--quick]

Runs the workload (and the worker processes it spawns) under ``py-spy record
--format raw --threads --subprocesses`` against a fresh database, then writes

* ``bench/out/profile-<W>-<engine>-<store>[-gil].raw``: the collapsed stacks
  (feed them to flamegraph.pl or speedscope for a picture), and
* ``...txt``: for each thread role (the client's main thread, perdure's run
  threads, its claim and heartbeat threads, ...), the share of that role's
  samples spent in each function (inclusive) and on each line (self, i.e.
  where the thread was when sampled: a line that calls into sqlite3/psycopg is
  time inside the database call).

Without ``--gil``, idle threads are sampled too (``--idle``), so the shares are
shares of wall-clock time of the role, waiting included; with ``--gil`` only
samples holding the GIL count, i.e. where the CPU goes.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import re
from pathlib import Path
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.append(int(entry))
    return out


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def spy_workers(spy: str, root: int, stem: str, flags: list[str], done: Any) -> list[Any]:
    """Attach a py-spy to every worker process the workload (a child of ``root``) spawns."""
    import time

    attached: dict[int, Any] = {}
    while not done():
        for child in children_of(root):
            for worker in children_of(child):
                if worker not in attached and " worker" in cmdline(worker):
                    out = f"{stem}.worker{len(attached)}.raw"
                    attached[worker] = (subprocess.Popen(
                        [spy, "record", "-f", "raw", "-o", out, "--pid", str(worker), *flags],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), out)
        time.sleep(0.02)
    return list(attached.values())


def role_of(thread: str, process: str) -> str:
    name = thread.split(":", 1)[1].strip() if ":" in thread else ""
    proc = ("worker-process" if " worker" in process or ".worker" in process
            else "workload-process")
    if not name:
        role = "main"
    else:
        role = re.sub(r"_\d+$", "", name)
        role = re.sub(r"-\d+$", "", role)
        role = re.sub(r"\s*\(.*\)$", "", role)
    return f"{proc} / {role}"


def parse(raw_paths: list[str]) -> dict[str, list[tuple[list[str], int]]]:
    roles: dict[str, list[tuple[list[str], int]]] = collections.defaultdict(list)
    for raw_path in raw_paths:
        _parse_one(raw_path, roles)
    return roles


def _parse_one(raw_path: str, roles: dict[str, list[tuple[list[str], int]]]) -> None:
    with open(raw_path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            stack, _, count = line.rpartition(" ")
            parts = stack.split(";")
            if parts and parts[0].startswith("thread"):  # a single-process recording
                parts = [f"process ?:{os.path.basename(raw_path)}", *parts]
            if len(parts) < 2 or not parts[1].startswith("thread"):
                continue
            process, thread, frames = parts[0], parts[1], parts[2:]
            roles[role_of(thread, process)].append((frames, int(count)))
    return roles


_ROOT = str(Path(__file__).resolve().parents[1])


def short(frame: str, line: bool) -> str:
    m = FRAME.match(frame)
    if not m:
        return frame
    file = m.group("file")
    for cut in ("site-packages/", "lib/python3.11/", f"{_ROOT}/src/", f"{_ROOT}/bench/"):
        if cut in file:
            file = file.split(cut, 1)[1]
    return f"{m.group('func')} ({file}{':' + m.group('line') if line and m.group('line') else ''})"


def _source_line(frame: str) -> str:
    """The source text of a frame's line, looked up on this machine."""
    import linecache
    import sysconfig

    m = FRAME.match(frame)
    if not m or not m.group("line"):
        return ""
    file = m.group("file")
    roots = [os.path.join(common.REPO_DIR, "src"), common.BENCH_DIR,
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"], ""]
    for root in roots:
        path = os.path.join(root, file)
        if os.path.exists(path):
            return linecache.getline(path, int(m.group("line"))).strip()
    return ""


def _func(frame: str) -> str:
    m = FRAME.match(frame)
    return m.group("func") if m else frame


def _nearest(frames: list[str], *prefixes: str) -> str:
    for fr in reversed(frames):
        m = FRAME.match(fr)
        if m and m.group("file").startswith(prefixes):
            return m.group("func")
    return "?"


def category(frames: list[str]) -> str:
    """Say, from the sampled stack and its source line, what the thread was doing."""
    if not frames:
        return "?"
    leaf = frames[-1]
    func, src = _func(leaf), _source_line(leaf)
    funcs = [_func(f) for f in frames]
    mine = ("perdure/", "perdure_workloads.py", "dbos_workloads.py", "common.py", "dbos/")
    if func == "_worker" and "concurrent/futures" in leaf:
        return "idle: run thread waiting for a run to execute"
    if "floor_probe" in funcs:
        return "benchmark: floor probe (not part of the timed loop)"
    if "COMMIT" in src:
        return f"SQLite COMMIT (WAL write + fsync) in {_nearest(frames[:-1], *mine)}"
    if "Client.result" in funcs and "sleep" in src:
        return "client: sleeping between polls in Client.result"
    if func == "Connection.wait" and "psycopg" in leaf:
        return f"waiting on PostgreSQL (round trip, commit) in {_nearest(frames, 'perdure/')}"
    if func in ("Condition.wait", "Event.wait", "Condition.wait_for", "Semaphore.acquire"):
        return f"waiting (condition/event) in {_nearest(frames, *mine)}"
    if ".acquire(" in src or func.endswith("acquire"):
        return f"waiting for a lock in {_nearest(frames, *mine)}"
    if "select" in func.lower() or "notifies" in funcs[-3:]:
        return f"waiting for I/O in {_nearest(frames, *mine)}"
    if "execute(" in src or "executemany(" in src:
        return f"SQL statement (driver call) in {_nearest(frames[:-1], *mine)}"
    if any(f.startswith(("Connection.", "BaseCursor.", "Cursor.")) for f in funcs[-4:]):
        return f"psycopg client code in {_nearest(frames, 'perdure/')}"
    return f"Python: {_nearest(frames, *mine)}"


def report(roles: dict[str, list[tuple[list[str], int]]], top: int) -> str:
    total = sum(c for stacks in roles.values() for _, c in stacks)
    out = [f"total samples: {total}"]
    ranked = sorted(roles.items(), key=lambda kv: -sum(c for _, c in kv[1]))
    for role, stacks in ranked:
        n = sum(c for _, c in stacks)
        if n < total * 0.01:
            continue
        inclusive: collections.Counter[str] = collections.Counter()
        leaf: collections.Counter[str] = collections.Counter()
        for frames, c in stacks:
            seen = set()
            for fr in frames:
                key = short(fr, line=False)
                if key not in seen:
                    seen.add(key)
                    inclusive[key] += c
            if frames:
                leaf[short(frames[-1], line=True)] += c
        out.append(f"\n## {role}: {n} samples ({100 * n / total:.1f}% of all)")
        cats: collections.Counter[str] = collections.Counter()
        for frames, c in stacks:
            cats[category(frames)] += c
        out.append("what the thread was doing (% of this role's samples):")
        out += [f"  {100 * c / n:5.1f}%  {k}" for k, c in cats.most_common(12)]
        out.append(f"top {top} functions, inclusive % of this role's samples:")
        out += [f"  {100 * c / n:5.1f}%  {k}" for k, c in inclusive.most_common(top)]
        out.append("top 15 lines where the thread was sampled (self %):")
        out += [f"  {100 * c / n:5.1f}%  {k}" for k, c in leaf.most_common(15)]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload")
    parser.add_argument("store", choices=["sqlite", "postgres"])
    parser.add_argument("--engine", default="perdure", choices=["perdure", "dbos"])
    parser.add_argument("--gil", action="store_true")
    parser.add_argument("--cpu", action="store_true",
                        help="sample only threads that are running (py-spy's default): CPU")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--svg", action="store_true", help="also record a flamegraph SVG")
    parser.add_argument("--reread", action="store_true",
                        help="only summarise the raw files of an earlier recording again")
    args = parser.parse_args()
    os.makedirs(common.OUT_DIR, exist_ok=True)
    stem = os.path.join(common.OUT_DIR, f"profile-{args.workload}-{args.engine}-{args.store}"
                        + ("-gil" if args.gil else "-cpu" if args.cpu else ""))
    module = os.path.join(common.BENCH_DIR, f"{args.engine}_workloads.py")
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    formats = [("raw", stem + ".raw")] + ([("flamegraph", stem + ".svg")] if args.svg else [])
    results: list[Any] = []
    spies: list[Any] = []
    if args.reread:
        import glob

        formats = []
        spies = [(None, path) for path in sorted(glob.glob(stem + ".worker*.raw"))]
        with open(stem + ".txt") as f:
            results = [f.read().split("workload result: ", 1)[1].split("\n", 1)[0]]
    for fmt, path in formats:
        db = common.create_database(args.store)
        result_path = stem + f".{fmt}.result.json"
        env = {**os.environ, "BENCH_DB": json.dumps(dataclasses.asdict(db)),
               "BENCH_QUICK": "1" if args.quick else "0", "BENCH_WORKERS": "1",
               "BENCH_RESULT": result_path}
        flags = ["-r", str(args.rate), "-t", "--nonblocking",
                 *(["-g"] if args.gil else [] if args.cpu else ["-i"])]
        cmd = [spy, "record", "-f", fmt, "-o", path, *flags,
               "--", sys.executable, module, args.workload]
        import threading

        try:
            proc = subprocess.Popen(cmd, env=env, cwd=common.REPO_DIR, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            if fmt == "raw":
                def attach(proc: Any = proc, flags: list[str] = flags) -> None:
                    spies.extend(spy_workers(spy, proc.pid, stem, flags,
                                             lambda: proc.poll() is not None))

                t = threading.Thread(target=attach)
                t.start()
            out, err = proc.communicate(timeout=1800)
            if fmt == "raw":
                t.join()
            for sp, _ in spies:
                sp.wait(timeout=60)
            proc.stdout, proc.stderr = out, err  # type: ignore[assignment]
        finally:
            common.drop_database(db)
        if proc.returncode != 0 or not os.path.exists(result_path):
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            sys.exit(proc.returncode or 1)
        with open(result_path) as f:
            results.append(json.load(f)["metrics"])
        os.unlink(result_path)
    text = report(parse([stem + ".raw", *(out for _, out in spies)]), args.top)
    header = (f"# py-spy profile: {args.workload} {args.engine} {args.store}"
              f"{' (GIL-holding samples only)' if args.gil else ' (wall clock, idle included)'}"
              f"{' --quick' if args.quick else ''}\n\nworkload result: "
              + " ".join(r if isinstance(r, str) else json.dumps(r) for r in results)
              + "\n\n")
    with open(stem + ".txt", "w") as f:
        f.write(header + text + "\n")
    print(header + text)


if __name__ == "__main__":
    main()
