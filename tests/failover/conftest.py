"""The failover tests' fixture: a pg_auto_failover formation (see pgaf.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pgaf import Formation, missing_binaries


@pytest.fixture
def formation() -> Iterator[Formation]:
    why = missing_binaries()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the failover test cannot run: {why}")
        pytest.skip(why)
    # Not pytest's tmp_path: the postgres user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="perdure-failover-"))
    if os.getuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(root, user.pw_uid, user.pw_gid)
    started = Formation(root)
    try:
        started.start()
        yield started
    finally:
        started.stop()
        shutil.rmtree(root, ignore_errors=True)
