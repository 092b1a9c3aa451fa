"""benchmarks/htm_read_scale.py at tiny sizes: it records every memory read, restores HTMAttention.read,
and its table shows the released initialisation's read larger than PyTorch's default."""

from chronomem.htm import HTMAttention
from helpers import load_benchmark

read_scale = load_benchmark("htm_read_scale")


def test_reads_are_recorded_and_the_method_restored(capsys):
    original = HTMAttention.read
    read_scale.main(["--dim", "16", "--batch", "2", "--steps", "40", "--seeds", "2"])
    assert HTMAttention.read is original
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()[2:]]
    ratio = {row[0].strip(): float(row[3]) for row in rows}
    assert set(ratio) == {"2.0", "None"}
    assert ratio["2.0"] > 2 * ratio["None"] > 0  # variance 2/fan-in against 1/(3 fan-in): ~sqrt(6) per projection
