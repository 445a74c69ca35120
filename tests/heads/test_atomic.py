"""heads/atomic.py: what the atomic writers leave has the modes a plain write would give (issue 20's
fault injection found the tiny target's folder 0700 and its weights 0600: unreadable to anyone else)."""

import os
import stat

import pytest

from specheads.heads.atomic import replace_dir, write_file, write_json, write_text


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
