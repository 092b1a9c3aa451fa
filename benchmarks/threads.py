"""Torch threads on a machine that other processes share: which default does not collapse.

One training step of a TLB (forward + backward, ``x [32, 100, 64]``) is timed in a fresh process for
each setting: torch threads 1 or 2 (or ``--threads``), OpenMP's wait policy as torch ships it (its
threads spin while they wait for work) or ``OMP_WAIT_POLICY=PASSIVE`` (they sleep), and the machine
idle or busy with a second process that computes as hard as it can on one core (``--busy`` of them).
Every setting runs in its own process because OpenMP reads its environment once, at start-up.
Wall-clock median over the steps, in ms, and each setting's ratio to one thread on the same load.

    python benchmarks/threads.py [--steps 30] [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from chronomem.threads import Measured

WORKER = r"""
import json, statistics, sys, time
import torch
from chronomem.tlb import TLB
threads, steps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)
model = TLB(dim=64, depth=2, num_heads=4, chunk_size=10, num_state=10)
x = torch.randn(32, 100, 64)
times = []
for i in range(steps + 3):
    start = time.perf_counter()
    y, _ = model(x)
    y.square().mean().backward()
    if i >= 3:  # the first calls allocate and warm the caches
        times.append(time.perf_counter() - start)
print(json.dumps({"ms": 1000 * statistics.median(times)}))
"""

# A process that keeps one core busy the way another job would: a spinning Python loop.
BUSY = "while True:\n    pass\n"


def measure(threads: int, policy: str | None, steps: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", WORKER, str(threads), str(steps)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--busy", type=int, default=1, help="competing processes while busy (default 1)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    rows = []
    # Around the whole script: a load above the cores at either end means the "idle" rows were not.
    measured = Measured(threads=sorted(args.threads), log=print).start()
    for load in ("idle", "busy"):
        others = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy if load == "busy" else 0)]
        try:
            time.sleep(0.5)
            for policy in (None, "PASSIVE"):
                for threads in args.threads:
                    rows.append((load, policy or "torch's default", threads, measure(threads, policy, args.steps)))
        finally:
            for proc in others:
                proc.kill()
                proc.wait()
    base = {load: ms for load, policy, threads, ms in rows if threads == 1 and policy == "torch's default"}
    print(f"TLB forward + backward, x [32, 100, 64], median of {args.steps} steps, {os.cpu_count()} cores\n")
    print("| load | OMP_WAIT_POLICY | threads | ms per step | vs 1 thread, same load |")
    print("|---|---|---|---|---|")
    for load, policy, threads, ms in rows:
        print(f"| {load} | {policy} | {threads} | {ms:.1f} | {ms / base[load]:.2f}x |")
    measured.stop()


if __name__ == "__main__":
    main()
