"""Byte-level language modelling: the corpus readers and their split, the text task, the LM head's
streaming evaluation and generation with the state, the lm experiment and ``chronomem lm sample``."""

import dataclasses
import gzip
import json
import math

import pytest
import torch
import torch.nn.functional as F

from chronomem.cli import main
from chronomem.experiments.base import run_experiment
from chronomem.heads import CausalLM, build_model
from chronomem.registry import get_experiment, get_task
from chronomem.tasks import text
from chronomem.tasks.text import TextTask, read_corpus, split_corpus
from chronomem.train import TrainConfig, train

WORDS = b"memory bottleneck slow fast chunk state attention segment byte dictionary".split()


def english(n_words: int, seed: int = 0) -> bytes:
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(WORDS), (n_words,), generator=generator).tolist()
    return b" ".join(WORDS[i] + (b".\n" if k % 9 == 8 else b"") for k, i in enumerate(picks))


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(english(2_000))
    return path


@pytest.fixture
def fake_gcide(tmp_path, monkeypatch):
    """A small gzip corpus where the task looks for dict-gcide."""
    path = tmp_path / "gcide.dict.dz"
    with gzip.open(path, "wb") as f:
        f.write(english(3_000, seed=1))
    monkeypatch.setattr(text, "GCIDE_PATH", path)
    return path


LM_MODELS = {
    "tlb": dict(chunk_size=4, num_state=3, self_per_cross=1),
    "transformer-xl": dict(segment_len=5, mem_len=6, memory_mode="sliding"),
}


def lm(model: str, corpus_file, seed: int = 0, steps: int = 0) -> CausalLM:
    """A tiny language model in float64; ``steps`` of training make its predictions follow the context
    (at initialisation the argmax mostly follows the last byte alone)."""
    torch.manual_seed(seed)
    task = TextTask(corpus="file", path=str(corpus_file), seq_len=16)
    net = build_model(model, task, dim=16, depth=2, num_heads=2, **LM_MODELS[model])
    if steps:
        train(net, task, TrainConfig(steps=steps, batch_size=8, lr=3e-3, eval_examples=2, progress=False,
                                     device="cpu"))
    return net.double().eval()


# ---- corpora and split ---------------------------------------------------------------------------


def test_the_split_is_contiguous_90_5_5_and_deterministic(corpus_file):
    data = read_corpus(corpus_file)
    parts = split_corpus(data, "file")
    assert parts == split_corpus(data, "file")
    assert parts["train"] + parts["val"] + parts["test"] == data  # contiguous, in file order, nothing lost
    assert (len(parts["train"]), len(parts["val"])) == (int(0.9 * len(data)), int(0.05 * len(data)))
    one, two = TextTask(corpus="file", path=str(corpus_file)), TextTask(corpus="file", path=str(corpus_file))
    for split in ("train", "val", "test"):
        assert torch.equal(one.split_tokens(split), two.split_tokens(split))
        assert bytes(one.split_tokens(split).tolist()) == parts[split]


def test_enwik8_takes_the_standard_split(monkeypatch):
    monkeypatch.setattr(text, "ENWIK8_BYTES", 20)
    monkeypatch.setattr(text, "ENWIK8_SPLIT", (18, 1, 1))
    data = bytes(range(20))
    assert split_corpus(data, "enwik8") == {"train": data[:18], "val": data[18:19], "test": data[19:]}
    with pytest.raises(ValueError, match="enwik8 must hold 20 bytes"):
        split_corpus(data[:19], "enwik8")


def test_a_gzip_corpus_reads_like_the_plain_text(tmp_path, corpus_file):
    packed = tmp_path / "corpus.txt.gz"
    with gzip.open(packed, "wb") as f:
        f.write(corpus_file.read_bytes())
    assert read_corpus(packed) == corpus_file.read_bytes()


def test_gcide_is_found_where_debian_installs_it(fake_gcide):
    task = TextTask()  # corpus="gcide" by default
    assert task.file == fake_gcide
    assert bytes(task.split_tokens("train")[:6].tolist()) == english(3_000, seed=1)[:6]


def test_missing_or_empty_corpora_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(text, "GCIDE_PATH", tmp_path / "nowhere.dict.dz")
    with pytest.raises(ValueError, match="apt-get install dict-gcide"):
        TextTask(corpus="gcide")
    with pytest.raises(ValueError, match=r"path: no file corpus at .*missing\.txt"):
        TextTask(corpus="file", path=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="corpus='file' needs path"):
        TextTask(corpus="file")
    with pytest.raises(ValueError, match="corpus='enwik8' needs data_dir"):
        TextTask(corpus="enwik8")
    with pytest.raises(ValueError, match=r"data_dir: no enwik8 corpus at .*enwik8.*enwik8\.zip"):
        TextTask(corpus="enwik8", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="data_dir=.* is not a directory"):
        TextTask(corpus="enwik8", data_dir=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="corpus must be one of"):
        TextTask(corpus="wikipedia")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"path: the corpus file .*empty\.txt.* is empty"):
        TextTask(corpus="file", path=str(empty))
    empty_gzip = tmp_path / "empty.gz"
    with gzip.open(empty_gzip, "wb"):
        pass
    with pytest.raises(ValueError, match="corpus is empty"):
        TextTask(corpus="file", path=str(empty_gzip)).split_tokens("test")
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 100)
    with pytest.raises(ValueError, match="seq_len=16 needs a test split of at least 17 bytes, got 5"):
        TextTask(corpus="file", path=str(short), seq_len=16).sample(2, torch.Generator(), "test")


# ---- the task ------------------------------------------------------------------------------------


def test_batches_are_windows_of_the_split_and_their_next_bytes(corpus_file):
    task = get_task("text")(corpus="file", path=str(corpus_file), seq_len=16)
    batch = task.sample(5, torch.Generator().manual_seed(3), split="val")
    again = task.sample(5, torch.Generator().manual_seed(3), split="val")
    assert torch.equal(batch.inputs, again.inputs) and batch.inputs.shape == (5, 16)
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    val = bytes(task.split_tokens("val").tolist())
    for inputs, targets in zip(batch.inputs.tolist(), batch.targets.tolist(), strict=True):
        assert bytes(inputs + targets[-1:]) in val
    assert isinstance(build_model("tlb", task, dim=8, depth=1, num_heads=2, chunk_size=4), CausalLM)


# ---- streaming evaluation and generation ----------------------------------------------------------


def one_call_loss(model: CausalLM, tokens: torch.Tensor) -> float:
    """Reference: the whole text in one call, mean next-token cross-entropy (nats)."""
    logits, _ = model(tokens[None, :-1].long())
    return F.cross_entropy(logits[0], tokens[1:].long()).item()


@pytest.mark.parametrize("model", sorted(LM_MODELS))
@pytest.mark.parametrize("segment_len", [1, 7, 64])
def test_streaming_evaluation_equals_one_call(model, segment_len, corpus_file):
    net = lm(model, corpus_file)
    tokens = TextTask(corpus="file", path=str(corpus_file)).split_tokens("test")[:41]
    result = net.evaluate_stream(tokens, segment_len=segment_len)
    assert result["tokens"] == 40
    assert result["loss"] == pytest.approx(one_call_loss(net, tokens), rel=1e-9)
    assert result["bits_per_token"] == pytest.approx(result["loss"] / math.log(2), rel=1e-12)


@pytest.mark.parametrize("model", sorted(LM_MODELS))
def test_streams_side_by_side_equal_each_piece_alone(model, corpus_file):
    net = lm(model, corpus_file)
    tokens = TextTask(corpus="file", path=str(corpus_file)).split_tokens("test")[:50]
    pieces = tokens.split(17)  # 17, 17, 16: the last stream is padded at its end
    expected = sum(one_call_loss(net, p) * (len(p) - 1) for p in pieces) / sum(len(p) - 1 for p in pieces)
    result = net.evaluate_stream(tokens, segment_len=5, streams=3)
    assert result["tokens"] == 47 and result["loss"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("model", sorted(LM_MODELS))
def test_greedy_generation_with_the_state_equals_recomputing_the_prefix(model, corpus_file):
    net = lm(model, corpus_file, seed=2, steps=40)
    prompt = b"slow fast"
    generated = net.generate(prompt, 12, temperature=0)
    assert len(set(generated.tolist())) > 1
    sequence = list(prompt)
    for _ in range(12):  # recompute from the whole prefix for every byte
        logits, _ = net(torch.tensor([sequence]))
        sequence.append(int(logits[0, -1].argmax()))
    assert generated.tolist() == sequence[len(prompt):]
    assert net.generate(prompt, 12, temperature=1.0, top_k=1).tolist() == generated.tolist()  # top-1 is greedy


def test_sampling_follows_its_generator_and_top_k(corpus_file):
    net = lm("tlb", corpus_file)
    one = net.generate(b"chunk", 30, temperature=2.0, generator=torch.Generator().manual_seed(5))
    two = net.generate(b"chunk", 30, temperature=2.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(one, two) and one.dtype == torch.long and len(set(one.tolist())) > 1
    logits, state = net(torch.tensor([list(b"chunk")]))
    top = set(logits[0, -1].topk(3).indices.tolist())
    first = [int(net.generate(b"chunk", 1, top_k=3, generator=torch.Generator().manual_seed(s))[0])
             for s in range(20)]
    assert set(first) <= top and len(set(first)) > 1


def test_generation_and_streaming_reject_what_cannot_stream(corpus_file):
    task = TextTask(corpus="file", path=str(corpus_file), seq_len=16)
    segment = build_model("transformer-xl", task, dim=8, depth=1, num_heads=2, segment_len=4, mem_len=4)
    with pytest.raises(ValueError, match="memory_mode='sliding'"):
        segment.generate(b"a", 3)
    stateless = build_model("transformer", task, dim=8, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="keeps none"):
        stateless.evaluate_stream(torch.arange(10), segment_len=4)
    net = lm("tlb", corpus_file)
    for kwargs, match in [(dict(prompt=b"", n=3), "prompt must be a non-empty"),
                          (dict(prompt=b"a", n=-1), "n must be an int >= 0"),
                          (dict(prompt=b"a", n=2, temperature=-1.0), "temperature must be"),
                          (dict(prompt=b"a", n=2, top_k=0), "top_k must be"),
                          (dict(prompt=b"a", n=2, top_k=257), "top_k must be")]:
        with pytest.raises(ValueError, match=match):
            net.generate(**kwargs)
    with pytest.raises(ValueError, match="segment_len must be a positive int"):
        net.evaluate_stream(torch.arange(10), segment_len=0)
    with pytest.raises(ValueError, match="at least 2 tokens per stream"):
        net.evaluate_stream(torch.arange(3), streams=3)
    assert net.generate(b"a", 0).shape == (0,)


# ---- the experiment and the CLI ------------------------------------------------------------------


def test_the_lm_experiment_runs_at_smoke_and_its_runs_sample(tmp_path, fake_gcide, capsys):
    results = run_experiment(get_experiment("lm"), "smoke", tmp_path / "lm", seed=0, progress=False)
    saved = json.loads((tmp_path / "lm" / "results.json").read_text())
    assert set(saved["results"]) == {"transformer-xl", "tlb", "tlb-small-chunk"}
    assert saved["results"] == results["results"]
    for model, row in saved["results"].items():
        run = saved["extra"][model]["runs"][0]
        assert 0 < row["test bpb"] == run["test bpb"] and run["generate_bytes_per_second"] > 0
        assert run["train_tokens_per_second"] > 0 and run["sample"].startswith("Memory, n. ")
    assert saved["paper"] == {"transformer-xl": {"test bpb": 0.99}, "tlb": {"test bpb": 0.97}}
    assert saved["config"]["test_bytes"] == 64
    capsys.readouterr()
    assert main(["lm", "sample", str(tmp_path / "lm" / "tlb" / "seed0"), "--prompt", "Memory", "--bytes", "5",
                 "--temperature", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("Memory")


def test_the_small_chunk_row_is_tlb_with_the_small_chunk():
    from chronomem.experiments.lm import MODELS, ROW_MODEL, SCALES, model_options

    for s in SCALES.values():
        assert s.small_chunk_size < s.chunk_size and s.seq_len % s.small_chunk_size == 0
        options, small = model_options("tlb", s), model_options("tlb-small-chunk", s)
        assert small == {**options, "chunk_size": s.small_chunk_size}  # nothing else differs
    assert SCALES["quick"].small_chunk_size == 16
    assert ROW_MODEL["tlb-small-chunk"] == "tlb" and "tlb-small-chunk" in MODELS
    s = SCALES["smoke"]
    net = build_model(ROW_MODEL["tlb-small-chunk"], TextTask(corpus="file", path=__file__, seq_len=s.seq_len),
                      **model_options("tlb-small-chunk", s))
    assert net.backbone.chunk_size == s.small_chunk_size == 4
    with pytest.raises(ValueError, match="no settings for row 'lstm'"):
        model_options("lstm", s)


def test_the_lm_experiment_trains_both_chunk_sizes(tmp_path, fake_gcide, capsys):
    results = run_experiment(get_experiment("lm"), "smoke", tmp_path / "lm", seed=0, progress=False,
                             models=("tlb", "tlb-small-chunk"))
    assert set(results["results"]) == {"tlb", "tlb-small-chunk"}
    assert results["paper"] == {"tlb": {"test bpb": 0.97}}  # the paper has no row with the small chunk
    chunks = {row: options["chunk_size"] for row, options in results["config"]["models"].items()}
    assert chunks == {"tlb": 8, "tlb-small-chunk": 4}
    for row, chunk in chunks.items():  # each run directory is a TLB of its chunk, which lm sample rebuilds
        spec = json.loads((tmp_path / "lm" / row / "seed0" / "config.json").read_text())["spec"]
        assert (spec["model"], spec["model_options"]["chunk_size"]) == ("tlb", chunk)
    assert results["results"]["tlb-small-chunk"]["test bpb"] != results["results"]["tlb"]["test bpb"]
    assert main(["lm", "sample", str(tmp_path / "lm" / "tlb-small-chunk" / "seed0"), "--prompt", "Memory",
                 "--bytes", "5", "--temperature", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith("Memory")


def test_under_a_time_budget_the_clock_ends_every_lm_run(tmp_path, fake_gcide, monkeypatch):
    from chronomem.experiments.base import BUDGET_STEP_CEILING
    from chronomem.experiments.lm import SCALES

    # smoke's lr is constant; with quick's cosine the decay must anneal over the budget
    monkeypatch.setitem(SCALES, "smoke", dataclasses.replace(SCALES["smoke"], schedule="cosine"))
    scale_steps = SCALES["smoke"].steps
    # A budget no step fits in: every row stops after its first step, and the run records the budget.
    cut = run_experiment(get_experiment("lm"), "smoke", tmp_path / "cut", seed=0, progress=False, time_budget=1e-9)
    for row in ("transformer-xl", "tlb", "tlb-small-chunk"):
        assert [(r["steps"], r["stopped_early"]) for r in cut["extra"][row]["runs"]] == [(1, True)]
    saved = json.loads((tmp_path / "cut" / "results.json").read_text())["config"]
    assert saved["time_budget"] == 1e-9
    # A budget longer than the scale's steps take: a fast model trains past them (equal time, not equal
    # steps) up to the ceiling, its cosine schedule annealed over the budget.
    long = run_experiment(get_experiment("lm"), "smoke", tmp_path / "long", seed=0, progress=False, time_budget=600.0,
                          models=("tlb",))
    assert long["extra"]["tlb"]["runs"][0]["steps"] == scale_steps * BUDGET_STEP_CEILING > scale_steps
    train_config = json.loads((tmp_path / "long" / "tlb" / "seed0" / "config.json").read_text())["train"]
    assert (train_config["steps"], train_config["time_budget"], train_config["anneal_by"]) == (
        scale_steps * BUDGET_STEP_CEILING, 600.0, "budget")
    # Without a budget the scale's steps end the runs.
    steps_only = run_experiment(get_experiment("lm"), "smoke", tmp_path / "steps", seed=0, progress=False,
                                models=("tlb",))
    assert steps_only["extra"]["tlb"]["runs"][0]["steps"] == scale_steps
    assert steps_only["config"]["time_budget"] is None


def test_lm_sample_rejects_a_run_that_is_not_a_language_model(tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["train", "--model", "lstm", "--task", "copy", "--task-opt", "seq_len=5", "--steps", "1",
                 "--batch-size", "2", "--eval-examples", "2", "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    capsys.readouterr()
    assert main(["lm", "sample", str(out), "--prompt", "x", "--device", "cpu"]) == 2
    assert "not a language model" in capsys.readouterr().err


def test_data_dir_reaches_only_experiments_that_read_data(tmp_path):
    with pytest.raises(ValueError, match="data_dir .* copy-baselines reads no data files"):
        run_experiment(get_experiment("copy-baselines"), "smoke", tmp_path / "c", data_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"data_dir: no enwik8 corpus"):
        get_experiment("lm").run("paper", tmp_path / "p", 0, data_dir=str(tmp_path))


def test_run_data_dir_flag_is_refused_by_an_experiment_without_data(tmp_path, capsys):
    assert main(["run", "copy-baselines", "--scale", "smoke", "--data-dir", str(tmp_path), "--out",
                 str(tmp_path / "c"), "--quiet"]) == 2
    assert "copy-baselines reads no data files" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
