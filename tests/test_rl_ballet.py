"""Ballet as an RL task: its ids through the vector-env factory, the level mixture, the Ballet encoder
and the reconstruction loss (paper 001 App. A.1), and an agent with every core that takes ``done``."""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("gymnasium")

from chronomem.agents import ActorCritic  # noqa: E402
from chronomem.encoders import BalletDecoder, BalletEncoder, FeatureEncoder, encoder_for  # noqa: E402
from chronomem.envs.ballet import BalletEnv, BalletMixture  # noqa: E402
from chronomem.envs.ballet_world import LEVELS, MAX_STEPS, ballet_id, sample_layout  # noqa: E402
from chronomem.envs.make import make_env, make_vector_env  # noqa: E402
from chronomem.registry import get_model  # noqa: E402
from chronomem.rl.ppo import Args, make_agent, train  # noqa: E402
from chronomem.tasks.ballet import Episodes, SupervisedBallet, observation_features  # noqa: E402

torch.set_num_threads(1)

# Every causal core an agent may use; a core that does not take done yet is skipped with the reason.
CORES = ("lstm", "relevance-lstm", "mem-lstm", "transformer-xl", "gtrxl", "tlb", "htm")
TINY = {"relevance-lstm": {"buffer_size": 2, "relevant_size": 2}, "transformer-xl": {"mem_len": 6},
        "gtrxl": {"mem_len": 6}, "tlb": {"chunk_size": 4, "num_state": 4, "self_per_cross": 1},
        "htm": {"chunk_size": 4, "memory_size": 4, "top_k": 2}}
UNUSABLE = re.compile(r"does not take episode ends")


def tiny_args(env: str, core: str = "lstm", **changes) -> Args:
    values = dict(env=env, core=core, dim=16, depth=1, heads=2, hidden=16, num_envs=2, num_steps=6,
                  num_minibatches=1, update_epochs=1, total_frames=12, progress=False, device="cpu")
    return Args(**{**values, **changes})


def train_or_skip(args: Args, options: dict):
    try:
        return train(args, options)
    except ValueError as err:
        if UNUSABLE.search(str(err)):
            pytest.skip(f"{args.core}: {err}")
        raise


@pytest.mark.parametrize("core", CORES)
def test_ballet_agent_trains_a_few_steps_with_every_core(core):
    result = train_or_skip(tiny_args(ballet_id("mixture", "symbolic"), core), TINY.get(core, {}))
    row = result.history[-1]
    assert result.frames == 12 and np.isfinite(row["policy_loss"]) and row["reconstruction_loss"] > 0


def test_pixel_ballet_agent_uses_the_papers_visual_encoder():
    result = train(tiny_args(ballet_id("2_delay16", "pixels")), {})
    encoder = result.agent.encoder
    first = encoder.conv[0]
    assert isinstance(encoder, BalletEncoder) and encoder.observation == "pixels"
    assert (first.kernel_size, first.stride, first.out_channels) == ((9, 9), (9, 9), 16)  # App. A Table 1
    assert np.isfinite(result.history[-1]["reconstruction_loss"])


def test_reconstruction_loss_is_its_own_metrics_column(tmp_path):
    train(tiny_args(ballet_id("mixture", "symbolic"), out=str(tmp_path / "on")), {})
    header = (tmp_path / "on" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "reconstruction_loss" in header
    off = train(tiny_args(ballet_id("mixture", "symbolic"), reconstruction=0.0, out=str(tmp_path / "off")), {})
    assert "reconstruction_loss" not in off.history[-1]
    assert not hasattr(off.agent, "decoder")


def test_reconstruction_default_is_on_for_ballet_only():
    ballet = make_env(ballet_id("2_delay16", "symbolic"))
    agent = make_agent(tiny_args("x"), {}, ballet.observation_space, ballet.action_space)
    assert agent.reconstruction == 1.0 and isinstance(agent.decoder, BalletDecoder)
    recall = make_env("chronomem/CueRecall-v0")
    agent = make_agent(tiny_args("x"), {}, recall.observation_space, recall.action_space)
    assert agent.reconstruction == 0.0
    with pytest.raises(ValueError, match="reconstruction=0.5 needs an encoder with a reconstruction decoder"):
        make_agent(tiny_args("x", reconstruction=0.5), {}, recall.observation_space, recall.action_space)
    with pytest.raises(ValueError, match="--reconstruction"):
        tiny_args("x", reconstruction=-1.0)


def ballet_batch(observation: str, batch: int = 2, steps: int = 3, seed: int = 0):
    envs = make_vector_env(ballet_id("mixture", observation), batch)
    obs, _ = envs.reset(seed=list(range(seed, seed + batch)))
    frames = [obs]
    for _ in range(steps - 1):
        obs, *_ = envs.step(envs.action_space.sample())
        frames.append(obs)
    envs.close()
    return {key: torch.as_tensor(np.stack([f[key] for f in frames], 1)) for key in frames[0]}, envs


@pytest.mark.parametrize("observation", ["symbolic", "pixels"])
def test_reconstruction_loss_matches_a_naive_reference(observation):
    """The decoder's per-step loss: the sigmoid cross-entropy of the picture in [0, 1], averaged over
    pixels and channels, plus the instruction's softmax cross-entropy (App. A.1)."""
    torch.manual_seed(0)
    obs, envs = ballet_batch(observation)
    encoder = encoder_for(envs.single_observation_space, 8)
    decoder = encoder.decoder(8)
    y = torch.randn(2, 3, 8)
    picture, instruction = encoder.reconstruction_targets(obs)
    loss = decoder(y, picture, instruction)
    scale = 1.0 if observation == "symbolic" else 255.0
    key = "grid" if observation == "symbolic" else "image"
    for b in range(2):
        for t in range(3):
            logits = decoder.deconv(decoder.unproject(y[b, t]).view(1, *decoder.shape))[0]  # [C, H, W]
            target = obs[key][b, t].permute(2, 0, 1).double() / scale
            p = torch.sigmoid(logits.double())
            image = -(target * p.log() + (1 - target) * (1 - p).log()).mean()
            word = -F.log_softmax(decoder.words(y[b, t]).double(), -1)[obs["instruction"][b, t]]
            torch.testing.assert_close(loss[b, t].double(), image + word, atol=1e-5, rtol=1e-5)


def test_reconstruction_trains_the_decoder_and_is_returned_only_when_asked():
    torch.manual_seed(0)
    obs, envs = ballet_batch("symbolic")
    encoder = encoder_for(envs.single_observation_space, 8)
    agent = ActorCritic(encoder, get_model("lstm")(8, 1, 2, True), 8, 8, reconstruction=2.0)
    with torch.inference_mode():
        acting = agent(obs)
    assert len(acting) == 3  # logits, value, state: acting decodes nothing
    logits, value, _, auxiliary = agent(obs, return_auxiliary=True)
    torch.testing.assert_close((logits.detach(), value.detach()), acting[:2])
    with torch.no_grad():  # w times the decoder's mean per-step loss (the naive reference above)
        y, _ = agent.core(encoder(obs))
        per_step = agent.decoder(y, *encoder.reconstruction_targets(obs))
    torch.testing.assert_close(auxiliary.detach(), 2.0 * per_step.mean())
    auxiliary.backward()
    for module in (agent.decoder.unproject, agent.decoder.words, encoder.project, agent.core):
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_ballet_encoder_rejects_bad_observations():
    encoder = BalletEncoder(8, "symbolic")
    good = {"grid": torch.zeros(1, 2, 11, 11, 36, dtype=torch.uint8),
            "instruction": torch.zeros(1, 2, dtype=torch.long)}
    assert encoder(good).shape == (1, 2, 8)
    with pytest.raises(TypeError, match="'grid' and 'instruction'"):
        encoder({"image": good["grid"], "instruction": good["instruction"]})
    with pytest.raises(ValueError, match=r"obs\['grid'\] must have shape \[B, N, 11, 11, 36\]"):
        encoder({**good, "grid": torch.zeros(1, 2, 11, 11, 3, dtype=torch.uint8)})
    with pytest.raises(TypeError, match="integer tensor"):
        encoder({**good, "grid": good["grid"].float()})
    with pytest.raises(ValueError, match=r"obs\['instruction'\] must hold indices in \[0, 14\)"):
        encoder({**good, "instruction": torch.full((1, 2), 14)})
    with pytest.raises(ValueError, match="observation must be"):
        BalletEncoder(8, "rgb")
    assert isinstance(encoder_for(make_env("chronomem/CueRecall-v0").observation_space, 8), FeatureEncoder)


@pytest.mark.parametrize("level", ["2_delay16", "8_delay48"])
def test_supervised_and_rl_ballet_share_the_environment(level):
    """The env the factory builds for RL is BalletEnv itself, and its observation stream up to the cue is
    exactly the supervised dataset's input for the same episode (one copy of the rules)."""
    env = make_env(ballet_id(level, "symbolic"))
    assert type(env.unwrapped) is BalletEnv
    task = SupervisedBallet(level, observation="symbolic_full")
    layout = sample_layout(np.random.default_rng(3), env.unwrapped.num_dancers)
    obs, info = env.reset(options={"layout": layout})
    stream = [observation_features(obs, "symbolic_full")]
    while len(stream) < task.length:
        obs, *_ = env.step(0)  # ignored until the cue
        stream.append(observation_features(obs, "symbolic_full"))
    expected = task.encode(Episodes.from_layouts([layout]))[0].numpy()
    assert (np.stack(stream) == expected).all()


def test_mixture_samples_the_papers_levels_uniformly_with_their_rules():
    env = make_env(ballet_id("mixture", "symbolic"))
    mixture = env.unwrapped
    assert isinstance(mixture, BalletMixture) and mixture.levels == LEVELS
    assert all(type(e) is BalletEnv for e in mixture.envs.values())
    counts = dict.fromkeys(LEVELS, 0)
    env.reset(seed=0)
    for _ in range(600):
        _, info = env.reset()
        counts[info["level"]] += 1
        assert info["cue_step"] == mixture.env.cue_step
    assert min(counts.values()) > 60  # 100 expected per level
    # an episode follows its level's rules: its BalletEnv, with that level's time limit
    for level, sub in mixture.envs.items():
        assert sub.level == level and sub.max_steps == MAX_STEPS[sub.delay]


def test_ballet_ids():
    assert ballet_id("2_delay16") == "chronomem/Ballet-2_delay16-v0"
    assert ballet_id("mixture", "symbolic") == "chronomem/Ballet-mixture-symbolic-v0"
    with pytest.raises(ValueError, match="level must be one of"):
        ballet_id("3_delay16")
    with pytest.raises(ValueError, match="observation"):
        ballet_id("2_delay16", "rgb")


@pytest.mark.parametrize("observation", ["symbolic", "pixels"])
def test_cells_encoder_is_the_cnns_first_layer_alone(observation):
    """``visual="cells"``: the per-cell linear map equals the CNN's first layer (the 1x1 convolution, or
    the 9x9 stride-9 one on pixels) with the same weights, read channels last, and the decoder's loss
    matches the naive per-step reference."""
    torch.manual_seed(0)
    obs, envs = ballet_batch(observation)
    space = envs.single_observation_space
    cnn, cells = encoder_for(space, 8, "cnn"), encoder_for(space, 8, "cells")
    assert not hasattr(cells, "conv") and cells.project.in_features == 16 * 11 * 11 + 32
    first = cnn.conv[0]
    with torch.no_grad():
        first.weight.copy_(cells.cells.weight.view(16, 9, 9, 3).permute(0, 3, 1, 2) if observation == "pixels"
                           else cells.cells.weight.view(16, 36, 1, 1))
        first.bias.copy_(cells.cells.bias)
    picture, _ = cnn.reconstruction_targets(obs)
    reference = torch.relu(first(picture.flatten(0, 1))).permute(0, 2, 3, 1)  # [B * N, 11, 11, 16]
    cell_picture, instruction = cells.reconstruction_targets(obs)
    torch.testing.assert_close(torch.relu(cells.cells(cell_picture)).flatten(0, 1), reference, atol=1e-5, rtol=1e-5)
    decoder, y = cells.decoder(8), torch.randn(2, 3, 8)
    loss = decoder(y, cell_picture, instruction)
    for b in range(2):
        for t in range(3):
            logits = decoder.cells(torch.relu(decoder.unproject(y[b, t]).view(11, 11, 16))).double()
            p, target = torch.sigmoid(logits), cell_picture[b, t].double()
            image = -(target * p.log() + (1 - target) * (1 - p).log()).mean()
            word = -F.log_softmax(decoder.words(y[b, t]).double(), -1)[instruction[b, t]]
            torch.testing.assert_close(loss[b, t].double(), image + word, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="visual must be one of"):
        BalletEncoder(8, visual="mlp")
    with pytest.raises(ValueError, match="visual='cells' is Ballet's"):
        encoder_for(make_env("chronomem/CueRecall-v0").observation_space, 8, "cells")


def test_reconstructing_every_kth_step_is_an_unbiased_estimate():
    """``reconstruct_every=k``: the loss of the steps ``phase, phase + k, ...``; its mean over the k
    phases is the loss of every step (T a multiple of k), and the phase is drawn per call."""
    torch.manual_seed(0)
    obs, envs = ballet_batch("symbolic", steps=6)
    space = envs.single_observation_space
    full = ActorCritic(encoder_for(space, 8, "cells"), get_model("lstm")(8, 1, 2, True), 8, 8, reconstruction=1.0)
    sub = ActorCritic(encoder_for(space, 8, "cells"), get_model("lstm")(8, 1, 2, True), 8, 8, reconstruction=1.0,
                      reconstruct_every=3)
    sub.load_state_dict(full.state_dict())
    every_step = full(obs, return_auxiliary=True)[3].detach()  # weight 1: the loss itself
    losses = {}  # one loss per phase: 3 distinct values over enough calls
    for _ in range(40):
        loss = sub(obs, return_auxiliary=True)[3].detach()
        losses[round(float(loss), 6)] = loss
    assert len(losses) == 3
    torch.testing.assert_close(torch.stack(list(losses.values())).mean(), every_step)
    with pytest.raises(ValueError, match="reconstruct_every"):
        ActorCritic(encoder_for(space, 8), get_model("lstm")(8, 1, 2, True), 8, 8, reconstruct_every=0)


def test_a_ballet_rl_model_may_carry_its_own_ppo_settings_and_its_runs_get_them(tmp_path, monkeypatch):
    import dataclasses

    from chronomem.experiments import ballet_rl

    quick = ballet_rl.SCALES["quick"]
    assert quick.ppo_of("htm")["depth"] == 1 and quick.ppo_of("lstm")["depth"] == quick.ppo["depth"] == 2
    # the variant row: HTM's options and settings, and gradients into its memory
    assert quick.models["htm-memory-gradient"] == dict(core="htm", **quick.models["htm"], memory_gradient=True)
    assert quick.ppo_of("htm-memory-gradient") == quick.ppo_of("htm")
    # htm-final-norm: HTM's options with the output LayerNorm, at the scale's depth (no one-layer change)
    assert quick.models["htm-final-norm"] == dict(core="htm", **quick.models["htm"], final_norm=True)
    assert quick.ppo_of("htm-final-norm") == quick.ppo and quick.ppo_of("htm-final-norm")["depth"] == 2
    with pytest.raises(ValueError, match="model htm: its PPO settings"):
        dataclasses.replace(quick, model_ppo={"htm": {"depth": 0}})
    smoke = dataclasses.replace(ballet_rl.SCALES["smoke"], model_ppo={"htm": {"hidden": 24}})
    monkeypatch.setitem(ballet_rl.SCALES, "smoke", smoke)
    seen = {}
    monkeypatch.setattr(ballet_rl, "check_cores", lambda name, models, env, ppo, options: seen.setdefault(
        ("check", models[0]), ppo["hidden"]))
    monkeypatch.setattr(ballet_rl, "plot_learning_curves", lambda *args: None)

    def trained(job):
        seen[(job.control, job.run.model)] = job.run.ppo["hidden"]
        return ({"seed": job.run.seed, "success": {level: 50.0 for level in job.scale.levels}, "curve": [(8, 0.5)],
                 **({"learned": True} if job.control else {})}, 1)

    monkeypatch.setattr(ballet_rl, "_train_and_evaluate", trained)
    ballet_rl._run("smoke", tmp_path, 0, models=("htm", "lstm"), progress=False)
    assert seen == {("check", "htm"): 24, ("check", "lstm"): 16, (True, "htm"): 24, (False, "htm"): 24,
                    (True, "lstm"): 16, (False, "lstm"): 16}
