"""W9: first-page latency of ``GET /api/v1/runs`` on the big store of W7.

Builds W7's store (1,000,000 succeeded and 100,000 waiting runs, bulk SQL
straight into the tables; ``--scale`` shrinks it), then times the API's first
page, 50 runs, as an HTTP client sees it through Starlette's test client
(token check included), with each filter the console offers, and a page deep
in the listing, and with a time window (runs span 30 days). Needs perdure's ``web`` extra, so it runs in the project's
``.venv`` rather than ``bench/.venv``::

    .venv/bin/python bench/console.py [--stores sqlite,postgres] [--scale 1] [--requests 200]

Target: first page p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common
import perdure_workloads as workloads
from starlette.testclient import TestClient

import perdure
from perdure.web import app as web_app
from perdure.web import auth

TARGET_P99_MS = 100.0


def _time(http: TestClient, url: str, head: dict[str, str], count: int) -> dict[str, float]:
    for _ in range(20):
        assert http.get(url, headers=head).status_code == 200
    took = []
    for _ in range(count):
        start = time.perf_counter()
        answer = http.get(url, headers=head)
        took.append((time.perf_counter() - start) * 1e3)
        assert answer.status_code == 200, answer.text
    return common.summary(took)


def measure(kind: str, scale: float, count: int) -> dict[str, Any]:
    os.environ["BENCH_W7_SCALE"] = str(scale)
    db = common.create_database(kind)
    try:
        made = workloads.generate_template(db)
        app = perdure.App(db.perdure_url, name=workloads.APP)
        try:
            secret = auth.mint(
                auth.token_store(app.store), app.name, "read", None, app.store.now()
            ).secret
            head = {"Authorization": f"Bearer {secret}"}
            http = TestClient(web_app.create_app(app.client), base_url="http://127.0.0.1")
            deep = "/api/v1/runs?limit=50"
            for _ in range(200):  # 10,000 runs in
                deep = "/api/v1/runs?limit=50&cursor=" + http.get(deep, headers=head).json()[
                    "next_cursor"
                ]
            urls = {
                "first page": "/api/v1/runs",
                "state=waiting": "/api/v1/runs?state=waiting",
                "state=succeeded": "/api/v1/runs?state=succeeded",
                "workflow=waiter": "/api/v1/runs?workflow=waiter",
                "state=failed (none)": "/api/v1/runs?state=failed",
                "created_after=1d": "/api/v1/runs?created_after=1d",
                "waiting, 14d..7d ago": "/api/v1/runs?state=waiting&created_after=14d"
                "&created_before=7d",
                "waiter, before 20d ago": "/api/v1/runs?workflow=waiter&created_before=20d",
                "failed, after 1h (none)": "/api/v1/runs?state=failed&created_after=1h",
                "page 201": deep,
            }
            return {
                "store": kind,
                **made,
                "ms": {name: _time(http, url, head, count) for name, url in urls.items()},
            }
        finally:
            app.close()
    finally:
        common.drop_database(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--requests", type=int, default=200)
    options = parser.parse_args()
    print("| store | listing | p50 ms | p99 ms | max ms | p99 <= 100 ms |")
    print("|---|---|---|---|---|---|")
    for kind in options.stores.split(","):
        found = measure(kind, options.scale, options.requests)
        for name, s in found["ms"].items():
            verdict = "PASS" if s["p99"] <= TARGET_P99_MS else "FAIL"
            print(f"| {kind} | {name} | {s['p50']:.2f} | {s['p99']:.2f} | {s['max']:.2f} | {verdict} |")
        print(f"<!-- {kind}: {found['finished_runs']} finished + {found['waiting_runs']} waiting "
              f"runs, generated in {found['generate_s']:.0f} s -->")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
