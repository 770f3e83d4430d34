"""Memory of the TRL adapter's reference store per process: Python lists vs memory-mapped.

    OMP_NUM_THREADS=1 python -m benchmarks.trl_store_memory            # 10,000 x 4,096
    OMP_NUM_THREADS=1 python -m benchmarks.trl_store_memory --responses 1000 --ranks 2

A store of ``--responses`` responses of ``--tokens`` tokens (random ids below 151,936 and
log-probs, prompts of ``--prompt`` tokens) is written with pyarrow. Each case runs in
fresh processes, after the imports:

- ``lists`` (the read path before): ``ReferenceStore.open`` then its ``samples``, the
  Python objects the stream used to keep, one copy per process;
- ``mapped`` (now): ``ReferenceStream`` (the store checked, then its Arrow IPC copy
  memory-mapped), every row of the store then drawn once, as an epoch would, by
  ``--ranks`` processes at once.

Per process: RSS and PSS (``/proc/self/smaps_rollup``: shared pages divided among the
processes that map them, so the PSS of all ranks adds up to what they hold together),
minus the RSS before the store was opened; and the peak RSS while opening.
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


def write_store(path: Path, responses: int, tokens: int, prompt: int) -> int:
    """The store's files, written column by column (no Python object per token)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

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
    pq.write_table(table, path / "samples.parquet")
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

    def open_store(path: str, ranks: int, rank: int):
        if args["case"] == "lists":
            return ReferenceStore.open(path, temperature=1.0).samples  # what the stream kept
        stream = ReferenceStream(path, 1.0, seed=0, pad_token_id=0)
        n, per = stream.samples.num_rows, 8
        for _ in range(n // (per * ranks)):  # one epoch, this rank's share of the draws
            stream.next_batch(per, rank, ranks, torch.device("cpu"))
        return stream

    with tempfile.TemporaryDirectory() as warm:  # the code paths' lazy imports, first
        write_store(Path(warm) / "store", 16, 8, 4)
        open_store(str(Path(warm) / "store"), 1, 0)
    before, pss_before = rss_bytes(), pss_bytes()
    held = open_store(args["store"], args["ranks"], args["rank"])
    opened_peak = peak_rss_bytes()
    barrier = Path(args["barrier"])
    (barrier / f"ready{args['rank']}").touch()
    while len(list(barrier.glob("ready*"))) < args["ranks"]:
        time.sleep(0.1)
    rss, pss = rss_bytes(), pss_bytes()
    (barrier / f"done{args['rank']}").touch()
    while len(list(barrier.glob("done*"))) < args["ranks"]:
        time.sleep(0.1)
    del held
    return {"rss": rss - before, "pss": pss - pss_before, "peak": opened_peak - before}


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
    ap.add_argument("--ranks", type=int, default=2, help="processes of the mapped case")
    ap.add_argument("--work-dir", default=None, help="where the store is written (a temp dir)")
    args = ap.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="trl_store_memory_"))
    os.environ["DIVRL_CACHE_DIR"] = str(work / "cache")  # the children's Arrow copies
    store = work / "store"
    disk = write_store(store, args.responses, args.tokens, args.prompt)
    case = {"store": str(store), "responses": args.responses}
    lists = run_ranks({**case, "case": "lists"}, 1)[0]
    print("lists", lists, flush=True)
    mapped = run_ranks({**case, "case": "mapped"}, args.ranks)
    print("mapped", mapped, flush=True)
    arrow = sum(f.stat().st_size for f in (work / "cache").rglob("*.arrow"))
    gb = 1e9
    rows = [
        [
            "lists (before), 1 process",
            f"{lists['rss'] / gb:.2f}",
            f"{lists['pss'] / gb:.2f}",
            f"{lists['peak'] / gb:.2f}",
            f"{args.ranks * lists['pss'] / gb:.2f} (x{args.ranks})",
        ]
    ]
    rows += [
        [
            f"mapped (now), rank {r}",
            f"{m['rss'] / gb:.2f}",
            f"{m['pss'] / gb:.2f}",
            f"{m['peak'] / gb:.2f}",
            "",
        ]
        for r, m in enumerate(mapped)
    ]
    total = sum(m["pss"] for m in mapped)
    rows.append(
        [f"mapped, {args.ranks} ranks together", "", f"{total / gb:.2f}", "", f"{total / gb:.2f}"]
    )
    table = markdown_table(
        ["case", "RSS (GB)", "PSS (GB)", "peak while opening (GB)", "all ranks (GB)"], rows
    )
    table += (
        f"\nstore: {args.responses} x {args.tokens} tokens, {disk / gb:.2f} GB on disk (parquet); "
        f"Arrow copy {arrow / gb:.2f} GB; all ranks mapped / disk = {total / disk:.2f}; "
        f"mapped rank 0 RSS / lists RSS = {mapped[0]['rss'] / lists['rss']:.3f}\n"
    )
    name = f"trl_store_memory_{args.responses}x{args.tokens}"
    write_results(name, {"disk": disk, "arrow": arrow, "lists": lists, "mapped": mapped}, table)
    return 0


if __name__ == "__main__":
    entry_point(main, child)
