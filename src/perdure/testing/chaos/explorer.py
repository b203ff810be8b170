"""Explore crash points: count a scenario's store writes, then crash at each one.

For each scenario, a first trial with no crash counts the store writes its
process makes (N). Then for each mode of :data:`trial.MODES` and each site
k in 1..N (or a sample of them, drawn with a seed), a trial crashes a process
at its k-th write and recovers in another; the report counts the trials and
the violations.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from perdure.testing.chaos import scenario as scenario_api
from perdure.testing.chaos import trial

SHORT_SITES = 12
"""Sites per scenario and mode in the short form; more are sampled down to this."""


@dataclass
class Row:
    """One scenario under one mode."""

    scenario: str
    mode: str
    writes: int
    sites: list[int]
    trials: int = 0
    violations: int = 0
    unreached: int = 0
    seconds: float = 0.0
    ends: dict[str, int] = field(default_factory=dict)
    """How the runs the drive started ended after the recovery, summed over trials."""
    details: list[str] = field(default_factory=list)

    @property
    def sampled(self) -> bool:
        return len(self.sites) < self.writes


@dataclass
class Report:
    """What an exploration found; ``ok`` when no trial broke an invariant."""

    store: str
    form: str
    seed: int
    rows: list[Row]
    seconds: float
    kept: str | None = None

    @property
    def violations(self) -> int:
        return sum(r.violations for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.violations == 0

    def to_json(self) -> dict[str, Any]:
        """Return the report as JSON values."""
        return {
            **{k: v for k, v in asdict(self).items() if k != "rows"},
            "violations": self.violations,
            "ok": self.ok,
            "rows": [{**asdict(r), "sampled": r.sampled} for r in self.rows],
        }

    def table(self) -> str:
        """Return the report as a Markdown table, with the details of every violation."""
        lines = [
            "| scenario | mode | writes (N) | sites tried | trials | violations | unreached "
            "| runs ended | time |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | --- | ---: |",
        ]
        for r in self.rows:
            tried = f"{len(r.sites)} of {r.writes}" + (" (sampled)" if r.sampled else " (all)")
            ended = ", ".join(f"{state} {n}" for state, n in sorted(r.ends.items()))
            lines.append(
                f"| {r.scenario} | {r.mode} | {r.writes} | {tried} | {r.trials} | "
                f"{r.violations} | {r.unreached} | {ended} | {r.seconds:.1f}s |"
            )
        trials = sum(r.trials for r in self.rows)
        lines.append(
            f"\n{self.form} form on {self.store}: {trials} trials, {self.violations} violations, "
            f"{self.seconds:.1f}s"
            + (
                f"; sites sampled with seed {self.seed}"
                if any(r.sampled for r in self.rows)
                else ""
            )
        )
        for r in self.rows:
            lines.extend(f"- {r.scenario} {r.mode}: {d}" for d in r.details)
        if self.kept:
            lines.append(f"trial folders with violations kept under {self.kept}")
        return "\n".join(lines)


def pick_sites(writes: int, limit: int | None, seed: int, scenario: str, mode: str) -> list[int]:
    """Return the sites to try: all of 1..writes, or ``limit`` of them drawn with ``seed``."""
    every = list(range(1, writes + 1))
    if limit is None or writes <= limit:
        return every
    # The first and last writes are always tried: a run's birth and its end.
    chooser = random.Random(f"{seed}:{scenario}:{mode}")
    middle = chooser.sample(every[1:-1], max(0, limit - 2))
    return sorted({every[0], every[-1], *middle})


def explore(
    scenarios: Sequence[scenario_api.Scenario],
    url: str,
    *,
    long: bool = False,
    sites: int | None = SHORT_SITES,
    modes: Sequence[str] = trial.MODES,
    seed: int = 0,
    timeout: float = 60.0,
    keep: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Crash every scenario at its store writes in every mode; return the report.

    Args:
        url: a SQLite URL (its file's folder holds the trial stores; the file
            itself is not used) or a PostgreSQL server URL (a database is
            created from a migrated template for every trial and dropped).
        long: try every site (``sites`` is then ignored).
        sites: at most this many sites per scenario and mode (short form).
        timeout: seconds a trial's process may take before it is killed and
            the trial counted as a violation.
        keep: a folder where the trial folders of violations are copied.
    """
    for mode in modes:
        if mode not in trial.MODES:
            raise ValueError(f"unknown mode {mode!r}; the modes are {', '.join(trial.MODES)}")
    began = time.monotonic()
    rows: list[Row] = []
    note = progress or (lambda _line: None)
    with tempfile.TemporaryDirectory(prefix="perdure-chaos-", dir=_folder_of(url)) as work:
        stores = trial.Stores(url, Path(work).resolve())
        try:
            for scenario in scenarios:
                rows.extend(
                    _explore_one(
                        scenario,
                        stores,
                        Path(work).resolve(),
                        long,
                        sites,
                        modes,
                        seed,
                        timeout,
                        keep,
                        note,
                    )
                )
        finally:
            stores.close()
    form = "long" if long else "short"
    return Report(_shown(url), form, seed, rows, time.monotonic() - began, keep)


def _explore_one(
    scenario: scenario_api.Scenario,
    stores: trial.Stores,
    work: Path,
    long: bool,
    sites: int | None,
    modes: Sequence[str],
    seed: int,
    timeout: float,
    keep: str | None,
    note: Callable[[str], None],
) -> list[Row]:
    began = time.monotonic()
    counted = _trial(scenario, stores, work / scenario.name / "count", None, timeout)
    writes = len(counted.writes)
    if counted.violations:
        # Crashing a scenario that already fails would only repeat its failure.
        row = Row(scenario.name, "no crash", writes, [], trials=1, violations=1)
        row.details = [f"without any crash: {v}" for v in counted.violations]
        row.ends, row.seconds = dict(counted.ends), time.monotonic() - began
        if keep is not None:
            shutil.copytree(
                counted.folder, Path(keep) / scenario.name / "count", dirs_exist_ok=True
            )
        note(f"{scenario.name}: fails without any crash; not explored")
        return [row]
    note(f"{scenario.name}: {writes} store writes ({', '.join(counted.writes)})")
    rows = []
    for mode in modes:
        row = Row(
            scenario.name,
            mode,
            writes,
            pick_sites(writes, None if long else sites, seed, scenario.name, mode),
        )
        began = time.monotonic()
        for k in row.sites:
            site = trial.Site(k, mode)
            folder = work / scenario.name / str(site)
            found = _trial(scenario, stores, folder, site, timeout)
            row.trials += 1
            for state, count in found.ends.items():
                row.ends[state] = row.ends.get(state, 0) + count
            if not found.reached:
                row.unreached += 1
            if found.violations:
                row.violations += 1
                row.details.extend(
                    f"{site} ({found.writes[k - 1] if k <= len(found.writes) else '?'}): {v}"
                    for v in found.violations
                )
                if keep is not None:
                    shutil.copytree(
                        folder, Path(keep) / scenario.name / str(site), dirs_exist_ok=True
                    )
            else:
                shutil.rmtree(folder, ignore_errors=True)
        row.seconds = time.monotonic() - began
        note(
            f"{scenario.name} {mode}: {row.trials} trials, {row.violations} violations, "
            f"{row.seconds:.1f}s"
        )
        rows.append(row)
    return rows


def _trial(
    scenario: scenario_api.Scenario,
    stores: trial.Stores,
    folder: Path,
    site: trial.Site | None,
    timeout: float,
) -> trial.Outcome:
    url = stores.fresh()
    try:
        return trial.run(scenario, url, folder, site, timeout)
    finally:
        stores.discard(url)


def _folder_of(url: str) -> str | None:
    """Return the folder of a SQLite URL's file (trial stores go there), or None."""
    if not url.startswith("sqlite:///"):
        return None
    folder = Path(url[len("sqlite:///") :]).parent
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def _shown(url: str) -> str:
    return "PostgreSQL" if url.startswith(("postgresql:", "postgres:")) else "SQLite"
