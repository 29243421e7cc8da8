"""Destinations checked before the work, atomic writes, and no partial file on an error or Ctrl-C."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from convforge import files
from convforge.errors import UserError


def test_check_writable_accepts_a_new_or_existing_file(tmp_path):
    assert files.check_writable(tmp_path / "new.json", "--out") == tmp_path / "new.json"
    (tmp_path / "old.json").write_text("old")
    assert files.check_writable(tmp_path / "old.json", "--out") == tmp_path / "old.json"   # replaced later
    assert files.check_writable(tmp_path / "a" / "b" / "t.json", "--trace", create_folders=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"], "the probe left nothing behind"


@pytest.mark.parametrize("where, words", [
    ("{tmp}/missing/x.json", "does not exist; create"),
    ("{tmp}", "is a folder"),
    ("{tmp}/file.txt/x.json", "is not a folder"),
    ("/proc/x.json", "cannot write --out /proc/x.json"),
    ("{tmp}/fifo", "not a regular file"),   # a FIFO, not /dev/null: a regression must not replace a device
])
def test_check_writable_refuses_with_one_line_naming_the_option(tmp_path, where, words):
    (tmp_path / "file.txt").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UserError) as caught:
        files.check_writable(where.format(tmp=tmp_path), "--out")
    message = str(caught.value)
    assert words in message and "--out" in message and "\n" not in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_check_writable_refuses_a_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(UserError, match="cannot write --json"):
            files.check_writable(folder / "x.json", "--json")
    finally:
        folder.chmod(0o755)


def test_check_writable_folder(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    assert files.check_writable_folder(tmp_path / "new" / "deeper", "--report")
    with pytest.raises(UserError, match="is a file, not a folder"):
        files.check_writable_folder(tmp_path / "file.txt", "--report")
    with pytest.raises(UserError, match="cannot write into --out /proc/r"):
        files.check_writable_folder("/proc/r", "--out")


class _Interrupt:
    """A fill that writes half its payload, then is hit by Ctrl-C."""

    def __init__(self, exc=KeyboardInterrupt):
        self.exc = exc

    def __call__(self, tmp):
        Path(tmp).write_text("half a fi")
        raise self.exc()


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError, ValueError])
def test_write_atomically_leaves_the_old_file_and_no_temporary_on_interrupt(tmp_path, exc):
    target = tmp_path / "rows.json"
    target.write_text("the old rows")
    with pytest.raises(exc):
        files.write_atomically(target, _Interrupt(exc))
    assert target.read_text() == "the old rows"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"]
    with pytest.raises(exc):
        files.write_atomically(tmp_path / "new.json", _Interrupt(exc))
    assert [p.name for p in tmp_path.iterdir()] == ["rows.json"], "no new file, whole or half"


def test_atomic_path_on_interrupt(tmp_path):
    target = tmp_path / "p.csv"
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_path(target) as tmp:
            tmp.write_text("a,b\n1,")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_replaces_an_existing_file_whole(tmp_path):
    target = tmp_path / "x.json"
    target.write_text("old")
    files.write_atomically(target, lambda tmp: Path(tmp).write_text("new"))
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_bench_out_interrupted_while_writing_leaves_nothing(cli, tmp_path, monkeypatch):
    """Ctrl-C while bench writes --out: exit 130, one line, no file (whole or half), no temporary."""
    from convforge.harness import bench
    from convforge.harness.probes import Ceilings
    real = Path.write_text

    def interrupted(self, text, *args, **kwargs):
        if self.parent == tmp_path:
            real(self, text[:10], *args, **kwargs)
            raise KeyboardInterrupt
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", interrupted)
    monkeypatch.setattr(bench, "measure_ceilings", lambda device: Ceilings(copy_gbps=10.0, matmul_gflops=100.0))
    code, out, err = cli("bench", "--device", "cpu", "--shape", "1,2,1,6,6,3", "--impl", "torch", "--repeat", "1",
                         "--warmup", "0", "--budget", "0.01", "--out", tmp_path / "rows.json", "--json")
    assert code == 130 and err.strip() == "convforge: interrupted", err
    assert list(tmp_path.iterdir()) == []

