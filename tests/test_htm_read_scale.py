"""benchmarks/htm_read_scale.py at tiny sizes: it records every memory read, restores HTMAttention.read,
and its table shows the released initialisation's read larger than PyTorch's default; the second table
shows the output jump once a chunk is read, and final_norm's output at the LayerNorm's scale."""

from chronomem.htm import HTMAttention
from helpers import load_benchmark

read_scale = load_benchmark("htm_read_scale")


def test_reads_are_recorded_and_the_method_restored(capsys):
    original = HTMAttention.read
    read_scale.main(["--dim", "16", "--batch", "2", "--steps", "40", "--seeds", "2"])
    assert HTMAttention.read is original
    first, second = capsys.readouterr().out.split("\n\n")
    rows = [line.split("|")[1:-1] for line in first.splitlines()[2:]]
    ratio = {row[0].strip(): float(row[3]) for row in rows}
    assert set(ratio) == {"2.0", "None"}
    assert ratio["2.0"] > 2 * ratio["None"] > 0  # variance 2/fan-in against 1/(3 fan-in): ~sqrt(6) per projection


def test_the_output_the_heads_read(capsys):
    read_scale.main(["--dim", "16", "--batch", "2", "--steps", "40", "--seeds", "2", "--input-scale", "0.1"])
    second = capsys.readouterr().out.split("\n\n")[1]
    rows = {row[0].strip(): (float(row[1]), float(row[2])) for row in
            (line.split("|")[1:-1] for line in second.splitlines()[2:])}
    assert set(rows) == set(read_scale.OUTPUT_VARIANTS)
    before, after = rows["paper's (init_scale=2)"]
    assert after > 2 * before  # the read of the slot encoding, from step 16 on
    for name in ("no slot encoding", "read gated shut"):
        assert rows[name][1] < 1.5 * rows[name][0]
    assert all(abs(n - 16**0.5) < 0.1 for n in rows["final_norm"])  # LN's output: norm sqrt(dim)
