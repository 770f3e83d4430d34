"""Memory of the TRL adapter's reference store per process: Python lists vs rows on demand.

    OMP_NUM_THREADS=1 python -m benchmarks.trl_store_memory            # 10,000 x 4,096
    OMP_NUM_THREADS=1 python -m benchmarks.trl_store_memory --responses 1000 --ranks 2

A store of ``--responses`` responses of ``--tokens`` tokens (random ids below 151,936 and
log-probs, prompts of ``--prompt`` tokens) is written as presample writes it (row groups of
``store_rows.ROWS_PER_GROUP``), or with ``--old-layout`` as stores were written before (one
row group, pyarrow's defaults). Each case runs in fresh processes, after the imports:

- ``lists`` (the oldest read path): ``ReferenceStore.open`` then its ``samples``, the
  Python objects the stream used to keep, one copy per process;
- ``rows`` (now): ``ReferenceStream`` (the store checked, then its rows read on demand
  from the parquet file, or from a re-grouped copy of an old-layout store), every row of
  the store then drawn once, as an epoch would, by ``--ranks`` processes at once, 8 rows
  per draw per process (the time per draw is reported).

Per process: RSS and PSS (``/proc/self/smaps_rollup``: shared pages divided among the
processes that map them, so the PSS of all ranks adds up to what they hold together),
minus the RSS before the store was opened; and the peak RSS from the open to the end of
the draws (``VmHWM``, reset just before the open), minus that same RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import entry_point, markdown_table, peak_rss_bytes, rss_bytes, write_results

VOCAB = 151_936


def pss_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> bool:
    """Start this process's peak RSS (``VmHWM``) afresh. ``ru_maxrss`` would not do: after
    fork and exec it starts at the parent's RSS (here the writer of the store, ~1 GB at
    10,000 x 4,096), above what a child that holds little ever reaches."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_bytes(reset: bool) -> int:
    """The peak RSS since :func:`reset_peak` (``ru_maxrss`` where it could not reset)."""
    if reset:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return peak_rss_bytes()


def write_store(path: Path, responses: int, tokens: int, prompt: int, old: bool = False) -> int:
    """The store's files, written column by column (no Python object per token); ``old``:
    in one row group, as presample wrote them before."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from divrl.data.store_rows import write_samples

    rng = np.random.default_rng(0)
    path.mkdir(parents=True, exist_ok=True)

    def lists(length: int, values) -> pa.Array:
        offsets = pa.array(np.arange(responses + 1, dtype=np.int32) * length)
        return pa.ListArray.from_arrays(offsets, pa.array(values))

    ids = [f"p{i}" for i in range(responses)]
    table = pa.table(
        {
            "prompt_id": pa.array(ids, pa.string()),
            "prompt_ids": lists(prompt, rng.integers(0, VOCAB, responses * prompt, np.int32)),
            "response_ids": lists(tokens, rng.integers(0, VOCAB, responses * tokens, np.int32)),
            "ref_log_probs": lists(
                tokens, -rng.exponential(1.0, responses * tokens).astype(np.float32)
            ),
            "text": pa.array([""] * responses, pa.string()),
        }
    )
    if old:
        pq.write_table(table, path / "samples.parquet")
    else:
        write_samples(table, path / "samples.parquet")
    prompts = pa.table(
        {
            "prompt_id": pa.array(ids, pa.string()),
            "n_correct": pa.array([8] * responses, pa.int32()),
            "split": pa.array(["near_perfect"] * responses, pa.string()),
            "has_reference": pa.array([True] * responses, pa.bool_()),
        }
    )
    pq.write_table(prompts, path / "prompts.parquet")
    (path / "manifest.json").write_text(json.dumps({"log_prob_temperature": 1.0}))
    return sum(f.stat().st_size for f in path.iterdir())


def child(args: dict) -> dict:
    """One process of one case; ``args["barrier"]``: a folder the ranks meet in."""
    import torch

    from divrl.data.reference_store import ReferenceStore
    from divrl.integrations.trl_dph import ReferenceStream

    torch.set_num_threads(1)
    timing: dict[str, float] = {}

    def open_store(path: str, ranks: int, rank: int):
        if args["case"] == "lists":
            return ReferenceStore.open(path, temperature=1.0).samples  # what the stream kept
        stream = ReferenceStream(path, 1.0, seed=0, pad_token_id=0)
        n, per = stream.rows.num_rows, 8
        draws = max(n // (per * ranks), 1)  # one epoch, this rank's share of the draws
        start = time.perf_counter()
        for _ in range(draws):
            stream.next_batch(per, rank, ranks, torch.device("cpu"))
        timing["draw"] = (time.perf_counter() - start) / draws
        return stream

    with tempfile.TemporaryDirectory() as warm:  # the code paths' lazy imports, first
        write_store(Path(warm) / "store", 16, 8, 4)
        open_store(str(Path(warm) / "store"), 1, 0)
    before, pss_before, reset = rss_bytes(), pss_bytes(), reset_peak()
    start = time.perf_counter()
    held = open_store(args["store"], args["ranks"], args["rank"])
    seconds = time.perf_counter() - start
    opened_peak = peak_bytes(reset)
    barrier = Path(args["barrier"])
    (barrier / f"ready{args['rank']}").touch()
    while len(list(barrier.glob("ready*"))) < args["ranks"]:
        time.sleep(0.1)
    rss, pss = rss_bytes(), pss_bytes()
    (barrier / f"done{args['rank']}").touch()
    while len(list(barrier.glob("done*"))) < args["ranks"]:
        time.sleep(0.1)
    del held
    return {
        "rss": rss - before,
        "pss": pss - pss_before,
        "peak": opened_peak - before,
        "seconds": seconds,  # the open, and for ``rows`` the epoch of draws
        "draw_s": timing.get("draw"),
    }


def run_ranks(case: dict, ranks: int) -> list[dict]:
    """``ranks`` child processes of ``case`` alive at once."""
    with tempfile.TemporaryDirectory() as barrier:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.trl_store_memory", "--child"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(ranks)
        ]
        for rank, proc in enumerate(procs):
            proc.stdin.write(json.dumps({**case, "rank": rank, "ranks": ranks, "barrier": barrier}))
            proc.stdin.close()
        results = []
        for proc in procs:
            out = proc.stdout.read()
            if proc.wait() != 0:
                raise RuntimeError(f"a {case['case']} child failed")
            results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--responses", type=int, default=10_000)
    ap.add_argument("--tokens", type=int, default=4_096)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--ranks", type=int, default=2, help="processes of the rows case")
    ap.add_argument("--old-layout", action="store_true", help="the store in one row group")
    ap.add_argument("--no-lists", action="store_true", help="skip the lists case")
    ap.add_argument("--work-dir", default=None, help="where the store is written (a temp dir)")
    args = ap.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="trl_store_memory_"))
    os.environ["DIVRL_CACHE_DIR"] = str(work / "cache")  # the children's re-grouped copies
    store = work / "store"
    disk = write_store(store, args.responses, args.tokens, args.prompt, args.old_layout)
    case = {"store": str(store), "responses": args.responses}
    lists = None if args.no_lists else run_ranks({**case, "case": "lists"}, 1)[0]
    print("lists", lists, flush=True)
    ranks = run_ranks({**case, "case": "rows"}, args.ranks)
    print("rows", ranks, flush=True)
    copy = sum(f.stat().st_size for f in (work / "cache").rglob("*.parquet"))
    table = report(args, disk, copy, lists, ranks)
    name = f"trl_store_memory_{args.responses}x{args.tokens}{'_old' if args.old_layout else ''}"
    write_results(name, {"disk": disk, "copy": copy, "lists": lists, "rows": ranks}, table)
    return 0


def report(args, disk: int, copy: int, lists: dict | None, ranks: list[dict]) -> str:
    gb = 1e9
    rows = []
    if lists is not None:
        rows.append(
            [
                "lists (before), 1 process",
                f"{lists['rss'] / gb:.3f}",
                f"{lists['pss'] / gb:.3f}",
                f"{lists['peak'] / gb:.3f}",
                "",
            ]
        )
    rows += [
        [
            f"rows on demand (now), rank {r}",
            f"{m['rss'] / gb:.3f}",
            f"{m['pss'] / gb:.3f}",
            f"{m['peak'] / gb:.3f}",
            f"{m['draw_s'] * 1000:.1f}",
        ]
        for r, m in enumerate(ranks)
    ]
    total = sum(m["pss"] for m in ranks)
    rows.append([f"rows, {args.ranks} ranks together", "", f"{total / gb:.3f}", "", ""])
    table = markdown_table(
        ["case", "RSS (GB)", "PSS (GB)", "peak, open + epoch (GB)", "ms per draw of 8 rows"],
        rows,
    )
    ratio = (
        "" if lists is None else f"; rank 0 RSS / lists RSS = {ranks[0]['rss'] / lists['rss']:.3f}"
    )
    table += (
        f"\nstore: {args.responses} x {args.tokens} tokens, {disk / gb:.3f} GB on disk (parquet"
        f"{', one row group' if args.old_layout else ''}); re-grouped copy {copy / gb:.3f} GB; "
        f"all ranks / disk = {total / disk:.3f}{ratio}\n"
    )
    return table


if __name__ == "__main__":
    entry_point(main, child)
