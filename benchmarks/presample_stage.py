"""The demo's presample stage (the DPH reference store of the sql toy world, with the demo's
``dph_js`` settings: 256 prompts x 8 seeded samples, then one reference sample per
near-perfect prompt, scoring included) timed with each rollout engine named, one after the
other in this process: wall-clock and this process's CPU seconds (generation runs here;
the verifier workers are other processes).

    python -m benchmarks.presample_stage static hf
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def time_presample(engine: str, out: Path) -> dict[str, float]:
    """Presample the demo's reference store into ``out`` with ``engine``; its seconds."""
    from divrl.commands.demo import demo_overrides
    from divrl.pipeline import open_world
    from divrl.training.config import load_config
    from divrl.training.presample import presample

    world = open_world("sql", progress=False)
    demo = argparse.Namespace(seed=0, steps=40, train_prompts=256)
    overrides = [*demo_overrides("dph_js", demo, out, world), f"rollout.engine={engine}"]
    config = load_config(Path("configs/toy/dph_js.yaml"), overrides)
    wall, cpu = time.perf_counter(), _cpu()
    presample(config, progress=False)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu() - cpu}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engines", nargs="+", help="registered engine names, timed in turn")
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for engine in opts.engines:
            result = time_presample(engine, Path(tmp) / engine)
            print(f"{engine}: wall {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
