"""The host-local wake-up channel of the embedded store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perdure.store.sqlite import wakeup


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_notification_sent_between_waits_is_kept(tmp_path: Path) -> None:
    channel = wakeup.Channel(str(tmp_path / "a.db"))
    assert channel.wait(0) is False  # listening from now on
    wakeup.Channel(str(tmp_path / "a.db")).notify()
    assert channel.wait(5) is True
    assert channel.wait(0) is False
    channel.close()
    assert not os.path.exists(channel.folder)  # the last listener removes the folder


def test_sockets_of_dead_processes_are_pruned_and_live_ones_kept(tmp_path: Path) -> None:
    folder = tmp_path / "perdure-wake-test"
    folder.mkdir()
    dead = folder / f"{_dead_pid()}-0.sock"
    live = folder / f"{os.getpid()}-0.sock"
    dead.touch()
    live.touch()
    wakeup._prune_folder(str(folder))
    assert not dead.exists()
    assert live.exists()
    live.unlink()
    wakeup._prune_folder(str(folder))
    assert not folder.exists()
