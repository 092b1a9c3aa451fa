"""chronomem's HTMAttention against published implementations of the same read (``htm-pytorch``).

    pip install "chronomem[bench]"          # or: pip install --no-deps htm-pytorch (needs einops)
    OMP_NUM_THREADS=1 python benchmarks/htm_peer.py --threads 1 [--repeats 5] [--out runs/peers]

An agent-sized read: B=4, Q=128 queries, M=256 chunks of C=32, top-k 8, D=256. Times are interleaved in
one process (median); peak memory is measured in a fresh process per implementation. Prints the
table with time and memory ratios and writes OUT/peers.json.
"""

import sys

from chronomem.bench import main

if __name__ == "__main__":
    sys.exit(main(["--peer", "only", *sys.argv[1:]]))
