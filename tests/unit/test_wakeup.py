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


def test_a_channel_given_back_is_taken_again_without_what_it_heard(tmp_path: Path) -> None:
    key = str(tmp_path / "a.db")
    listeners = wakeup.Listeners(key, "live", keep=1)
    first = listeners.take()
    listeners.give(first)
    wakeup.Channel(key, "live").notify()  # heard while nobody watched
    again = listeners.take()
    assert again is first
    assert again.wait(0) is False
    wakeup.Channel(key, "live").notify()
    assert again.wait(5) is True
    listeners.give(again)
    listeners.close()
    assert not os.path.exists(first.folder)


def test_listeners_keep_at_most_their_bound_and_close_the_rest(tmp_path: Path) -> None:
    listeners = wakeup.Listeners(str(tmp_path / "a.db"), "live", keep=1)
    one, two = listeners.take(), listeners.take()
    assert one is not two
    listeners.give(one)
    listeners.give(two)  # over the bound: closed now
    assert sorted(os.listdir(one.folder)) == [os.path.basename(one._path or "")]
    listeners.close()
    listeners.give(listeners.take())  # after close, a channel given back is closed
    assert not os.path.exists(one.folder)


def test_a_forked_process_does_not_take_its_parents_channel(tmp_path: Path) -> None:
    listeners = wakeup.Listeners(str(tmp_path / "a.db"), "live")
    parent = listeners.take()
    listeners.give(parent)
    listeners._pid = -1  # as a forked child sees it: another process made these
    child = listeners.take()
    assert child is not parent
    listeners.give(child)
    listeners.close()
    parent.close()


def test_a_channel_keeps_the_answers_it_was_told(tmp_path: Path) -> None:
    key = str(tmp_path / "a.db")
    channel = wakeup.Channel(key, "live")
    channel.listen()
    told = wakeup.told("r1", "u1", '"yes"')
    assert told is not None
    wakeup.Channel(key, "live").notify(told)
    assert channel.answer("r1", "u1") is None  # not taken in yet
    assert channel.wait(5) is True
    assert channel.answer("r1", "u1") == '"yes"'
    assert channel.answer("r1", "u2") is None
    # Too long to tell: its sender reads it back.
    assert wakeup.told("r1", "u3", '"' + "x" * 8000 + '"') is None
    # A bare wake-up, or one this version cannot read, tells nothing and still wakes.
    wakeup.Channel(key, "live").notify(b"{not json")
    assert channel.wait(5) is True
    for i in range(wakeup._TOLD_HELD + 1):
        wakeup.Channel(key, "live").notify(wakeup.told("r2", f"u{i}", "1") or b"!")
        channel.wait(5)
    assert channel.answer("r2", "u0") is None  # the oldest went first
    assert channel.answer("r2", f"u{wakeup._TOLD_HELD}") == "1"
    assert channel.answer("r1", "u1") is None
    channel.close()
