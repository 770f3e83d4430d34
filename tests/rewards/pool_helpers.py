"""Verifier functions for the pool tests (imported by name in the worker processes)."""

import os


def always_out_of_memory(solution_str, ground_truth, extra_info):
    bytearray(64 * 1024**3)  # far above the worker's address-space limit
    return 1.0


def out_of_memory_once(solution_str, ground_truth, extra_info):
    """MemoryError the first time (per marker file), then a normal verdict."""
    marker = extra_info["marker"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        bytearray(64 * 1024**3)
    return float(solution_str == ground_truth)
