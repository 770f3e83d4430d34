"""Which SQLite open mode reads a dataset database without writing beside it.

Usage: ``python benchmarks/sql_open_modes.py``. For a rollback-journal database, a WAL
database without a -wal file and one whose -wal holds a committed transaction, opens it
with ``mode=ro`` and with ``mode=ro&immutable=1`` in a fresh folder and prints the row
count read and the files present afterwards (docs/rewards.md, "Opening the database").
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile


def make(folder: str, wal: bool, pending: bool) -> str:
    path = os.path.join(folder, "x.sqlite")
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(a)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(10)])
    conn.commit()
    if pending:  # keep a copy of the files while the last commit is only in the -wal
        conn.execute("INSERT INTO t VALUES (99)")
        conn.commit()
        shutil.copyfile(path, path + ".keep")
        shutil.copyfile(path + "-wal", path + "-wal.keep")
    conn.close()
    if pending:
        os.replace(path + ".keep", path)
        os.replace(path + "-wal.keep", path + "-wal")
    return path


def main() -> None:
    for wal, pending in ((False, False), (True, False), (True, True)):
        for query in ("mode=ro", "mode=ro&immutable=1"):
            folder = tempfile.mkdtemp()
            path = make(folder, wal, pending)
            try:
                conn = sqlite3.connect(f"file:{path}?{query}", uri=True)
                got = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]
                conn.close()
            except sqlite3.Error as e:
                got = f"error: {e}"
            kind = "rollback" if not wal else ("wal+pending" if pending else "wal")
            print(f"{kind:12} {query:20} read={got!s:22} files={sorted(os.listdir(folder))}")
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()
