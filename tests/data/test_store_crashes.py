"""The DPH reference store when writers are killed and readers meet writers: what a dead
writer leaves is cleaned up or put back, a reader sees one store whole, and the folder has
the permissions of the umask (docs/reliability.md, "Reference store")."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time

from divrl.data import reference_store
from divrl.data.reference_store import ReferenceSample, ReferenceStore, write_reference_store


def _store(path, tag: str, n: int = 2):
    samples = [ReferenceSample(f"{tag}{i}", [1, 2], [3, 4], [-0.5, -0.25], tag) for i in range(n)]
    rows = [
        {"prompt_id": s.prompt_id, "n_correct": 4, "split": "near_perfect", "has_reference": True}
        for s in samples
    ]
    return write_reference_store(path, samples, rows, {"log_prob_temperature": 1.0, "tag": tag})


def _killed_writer(path, kill_in: str) -> None:
    """A writer of ``path`` (store "b") that dies with SIGKILL's exit, without cleanup:
    while writing its files (``tables``), or between the two renames of the swap used where
    the kernel has no renameat2 (``fallback``)."""
    code = textwrap.dedent(f"""
        import os, sys
        from divrl.data import reference_store, store_files
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_store_crashes import _store
        if {kill_in!r} == "tables":
            reference_store._write_tables = lambda *a: os._exit(9)
        else:
            store_files._exchange = lambda a, b: False
            calls, replace = [], os.replace
            def dying_replace(a, b):
                calls.append(a)
                if len(calls) == 2:  # the old store is moved aside, the new one not yet in
                    os._exit(9)
                replace(a, b)
            store_files.os.replace = dying_replace
        _store({str(path)!r}, "b")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 9, out.stderr


def _beside(path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_temp_folders_of_killed_writers_are_removed_by_the_next_writer(tmp_path):
    """Each presample killed while writing left a .<store>.tmpXXXX folder for good."""
    store = tmp_path / "store"
    _store(store, "a")
    for _ in range(2):
        _killed_writer(store, "tables")
    # the second writer removed the first one's folder before it died too
    assert len([n for n in _beside(store) if n.startswith(".store.tmp")]) == 1
    assert ReferenceStore(store).manifest["tag"] == "a"  # the store itself is untouched
    _store(store, "c")
    assert _beside(store) == [".store.lock"]
    assert ReferenceStore(store).manifest["tag"] == "c"


def test_a_writer_killed_between_the_fallback_renames_leaves_the_previous_store(tmp_path):
    """Without renameat2 (NFS), a kill between the two renames left no store at the path and
    the previous one hidden in .<store>.oldXXXX/: training said "no DPH reference store"."""
    store = tmp_path / "store"
    _store(store, "a")
    _killed_writer(store, "fallback")
    assert not store.exists()  # the state the kill leaves
    opened = ReferenceStore(store)  # a reader puts the previous store back
    assert opened.manifest["tag"] == "a" and [s.prompt_id for s in opened.samples] == ["a0", "a1"]
    assert not [n for n in _beside(store) if n.startswith(".store.old")]
    _killed_writer(store, "fallback")
    _store(store, "c")  # so does the next writer, and it sweeps what the dead one left
    assert ReferenceStore(store).manifest["tag"] == "c" and _beside(store) == [".store.lock"]


def test_a_reader_never_mixes_two_stores(tmp_path, monkeypatch):
    """A presample replacing the store while a training run opened it could give the reader
    the manifest of one store with the samples of the other."""
    store = tmp_path / "store"
    _store(store, "a")
    real_read_table = reference_store.read_table
    writer = threading.Thread(target=_store, args=(store, "b", 3))

    def read_table_while_a_writer_swaps(path, columns, optional=()):
        if not writer.is_alive() and writer.ident is None:
            writer.start()
            time.sleep(1.0)  # time enough to write and swap the tiny store, if it may
        return real_read_table(path, columns, optional)

    monkeypatch.setattr(reference_store, "read_table", read_table_while_a_writer_swaps)
    opened = ReferenceStore(store)  # reads the manifest, then samples and prompts
    writer.join()
    tags = {opened.manifest["tag"], *(s.text for s in opened.samples)}
    assert tags == {"a"} and opened.prompts["prompt_id"] == ["a0", "a1"]
    monkeypatch.setattr(reference_store, "read_table", real_read_table)
    after = ReferenceStore(store)
    assert {after.manifest["tag"], *(s.text for s in after.samples)} == {"b"}


def test_the_store_folder_honours_the_umask(tmp_path):
    """The folder was created 0700 (mkdtemp's mode) whatever the umask."""
    before = os.umask(0o022)
    try:
        _store(tmp_path / "store", "a")
        os.umask(0o027)
        _store(tmp_path / "group", "a")
    finally:
        os.umask(before)
    assert stat.S_IMODE((tmp_path / "store").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "group").stat().st_mode) == 0o750


def test_files_of_another_writer_are_refused_without_locks_too(tmp_path, monkeypatch):
    """Where the filesystem has no flock, the generation each writer puts in all three
    files still tells the reader that the samples are of another store."""
    import shutil

    import pytest

    from divrl.data.reference_store import ReferenceStoreError

    _store(tmp_path / "a", "a")
    _store(tmp_path / "b", "b")
    shutil.copy(tmp_path / "b" / "samples.parquet", tmp_path / "a" / "samples.parquet")
    monkeypatch.setattr(reference_store.time, "sleep", lambda seconds: None)
    with pytest.raises(ReferenceStoreError, match=r"a/samples\.parquet is not of the store that"):
        ReferenceStore(tmp_path / "a")
