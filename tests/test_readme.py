"""Every Python block in README.md runs on its own (its own imports, a fresh namespace)."""

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs_alone(index, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    torch.manual_seed(0)
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {"__name__": "__readme__"})


def test_the_training_example_runs_twice(tmp_path, monkeypatch):
    # Run twice in one directory, the example neither fails nor loses the first run: out= never
    # overwrites a run, so the second call resumes it (already at its last step: the same metrics).
    block = next(b for b in BLOCKS if "train_spec" in b)
    monkeypatch.chdir(tmp_path)
    spaces = []
    for _ in range(2):
        spaces.append({"__name__": "__readme__"})
        exec(compile(block, "README.md training block", "exec"), spaces[-1])
    first, second = (space["result"] for space in spaces)
    assert second.steps == first.steps == 50 and second.metrics == first.metrics
