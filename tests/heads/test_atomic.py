"""core/atomic.py: what the atomic writers leave has the modes a plain write would give (fault injection
once found the tiny target's folder 0700 and its weights 0600: unreadable to anyone else)."""

import os
import stat
import subprocess
import sys

import pytest

from specheads.core.atomic import replace_dir, write_file, write_json, write_text


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    before = os.umask(request.param)
    yield request.param
    os.umask(before)


def test_written_files_and_folders_follow_the_umask(umask, tmp_path):
    write_text(tmp_path / "a.txt", "a")
    write_json(tmp_path / "b.json", {"b": 1})
    write_file(tmp_path / "c.bin", lambda tmp: open(tmp, "wb").write(b"c"))
    with replace_dir(tmp_path / "folder") as tmp:
        (tmp / "inside.txt").write_text("x")
    for name in ("a.txt", "b.json", "c.bin"):
        assert mode(tmp_path / name) == 0o666 & ~umask, name
    assert mode(tmp_path / "folder") == 0o777 & ~umask
    assert (tmp_path / "folder" / "inside.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json", "c.bin", "folder"]


def test_a_write_removes_what_a_killed_writer_of_the_same_file_left(tmp_path):
    """Fault injection (scripts/fault_inject.py) found a resumed `specheads cache` folder holding the
    `.index.json.*.tmp` files of the runs it killed: temporary names carry the writer's pid, and the next
    write of the file removes a dead writer's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".index.json.tmp-{dead.pid}-abcd"
    stale.write_text("half")
    alive = tmp_path / f".index.json.tmp-{os.getppid()}-abcd"  # a running writer's
    alive.write_text("busy")
    write_json(tmp_path / "index.json", {"shards": []})
    assert sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "index.json"]
