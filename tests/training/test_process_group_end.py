"""`release_process_group`: the group is destroyed, and a DDP wrapper that would outlive it
(the exit hang of its docstring) is named in a warning. In a subprocess: a process group in
the test process would leak into the other tests."""

import json
import subprocess
import sys

SCRIPT = r"""
import gc, json, logging, os, sys
import torch
from torch.nn.parallel import DistributedDataParallel
from divrl.distributed import live_ddp_wrappers, release_process_group

records = []
handler = logging.Handler()
handler.emit = lambda record: records.append(record.getMessage())
logging.getLogger("divrl.distributed").addHandler(handler)

def group():
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)

group()
kept = DistributedDataParallel(torch.nn.Linear(2, 2))
kept(torch.ones(1, 2)).sum().backward()
release_process_group()  # `kept` still alive: warned
first = {"warned": list(records), "initialized": torch.distributed.is_initialized()}
del kept
gc.collect()
records.clear()
group()
dropped = DistributedDataParallel(torch.nn.Linear(2, 2))
dropped(torch.ones(1, 2)).sum().backward()
live = len(live_ddp_wrappers())
del dropped
release_process_group()  # nothing alive: silent
second = {"live_before": live, "warned": list(records), "initialized": torch.distributed.is_initialized()}
release_process_group()  # no group: a no-op
print(json.dumps([first, second]))
"""


def test_release_warns_about_a_live_wrapper_and_destroys_the_group():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    assert not first["initialized"] and not second["initialized"]
    assert len(first["warned"]) == 1 and "1 DistributedDataParallel" in first["warned"][0]
    assert second == {"live_before": 1, "warned": [], "initialized": False}
