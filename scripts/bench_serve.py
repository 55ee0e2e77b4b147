"""What the PyTorch sides of the CPU benches share: the timing rule and the --serve protocol.

Imported by `bench_attention_reference.py` and `bench_products_reference.py` (run as
`python scripts/<name>.py`, so this directory is on `sys.path`).
"""

import json
import statistics
import sys
import time

import torch


def median_time(fn, reps, warmup, warmup_ms=0.0):
    """Median and fastest seconds of `reps` calls.

    At least `warmup` calls and `warmup_ms` milliseconds first (the Rust side's rule)."""
    began, calls = time.perf_counter(), 0
    while calls < warmup or (time.perf_counter() - began) * 1e3 < warmup_ms:
        fn()
        calls += 1
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def start(threads):
    """torch's threads and seed, as every bench child sets them."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)


def requests():
    """The --serve protocol: a {"ready": version} line, then one JSON request per stdin line
    (the caller prints one JSON line back per request)."""
    print(json.dumps({"ready": torch.__version__}), flush=True)
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)
