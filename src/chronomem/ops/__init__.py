"""The machinery behind the mechanisms, each fast path beside a naive reference of the same function
(a plain loop over steps, chunks or rows) and tested against it by name, values and gradients:

* ``htm_mix``: HTM's within-chunk read of the top-k chunks (gathered, dense or the reference).
* ``htm_local``: HTM's per-call bookkeeping: episode numbering (once per call) and the local window.
* ``htm_chunks``: HTM's chunks a call completes, committed to the ring buffer and read.
* ``tlb_chunks``: TLB's chunk layout of a call, the wave schedule of its recurrence, its cache.

A mechanism file (htm.py, tlb.py) reads beside its paper and calls these; nothing here is an idea of
the papers, only how it is computed.
"""
