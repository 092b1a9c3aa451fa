"""PPO scale-out (chronomem.rl.ppo under torchrun): two CPU learner ranks (gloo), each with its own
environments and action samples, end with identical weights; the logged rows are the ranks' averages
and only rank 0 writes the run directory."""

import csv
import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("gymnasium")

WORLD_SIZE = 2
ARGS = dict(env="chronomem/CueRecall-v0", core="lstm", dim=16, hidden=16, num_envs=4, num_steps=8,
            num_minibatches=2, update_epochs=2, total_frames=4 * 8 * WORLD_SIZE * 3, lr=1e-2, seed=5,
            progress=False, device="cpu")  # CPU ranks (gloo) on any machine, a GPU's too


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, out: str) -> None:
    """One torchrun rank: the environment variables torchrun sets, then the ordinary ``train``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD_SIZE))
    from chronomem.rl.ppo import Args, train

    torch.manual_seed(1000 + rank)  # train must not depend on the caller's RNG
    result = train(Args(**ARGS, out=os.path.join(out, "run")))
    torch.save({k: v.detach().clone() for k, v in result.agent.state_dict().items()},
               os.path.join(out, f"weights_{rank}.pt"))
    with open(os.path.join(out, f"history_{rank}.json"), "w") as f:
        json.dump({"frames": result.frames, "history": result.history}, f)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(rank_main, args=(free_port(), str(out)), nprocs=WORLD_SIZE, join=True)
    weights = [torch.load(out / f"weights_{r}.pt", weights_only=True) for r in range(WORLD_SIZE)]
    runs = [json.loads((out / f"history_{r}.json").read_text()) for r in range(WORLD_SIZE)]
    return out, weights, runs


def test_two_gloo_ranks_end_with_identical_weights(two_ranks):
    from chronomem.envs.make import make_vector_env
    from chronomem.rl.ppo import Args, make_agent

    _, (first, second), _ = two_ranks
    envs = make_vector_env(ARGS["env"], 1)
    torch.manual_seed(ARGS["seed"])
    initial = make_agent(Args(**ARGS), {}, envs.single_observation_space, envs.single_action_space).state_dict()
    envs.close()
    assert first.keys() == second.keys() == initial.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0, msg=name)
    assert any(not torch.equal(first[name], initial[name]) for name in first)  # the ranks did learn


def test_rows_are_averaged_over_ranks_and_only_rank_0_writes(two_ranks):
    out, _, runs = two_ranks
    frames_per_update = ARGS["num_envs"] * ARGS["num_steps"] * WORLD_SIZE
    clocks = ("sps", "seconds", "seconds_env", "seconds_act", "seconds_learn")  # each rank's own clock
    same = [[{k: v for k, v in row.items() if k not in clocks} for row in run["history"]] for run in runs]
    assert same[0] == same[1]  # every rank logs the same (averaged) rows
    assert all(row["episodes"] > 0 for row in runs[0]["history"])
    assert runs[0]["frames"] == ARGS["total_frames"]  # total_frames counts the frames of all ranks
    assert [row["step"] for row in runs[0]["history"]] == [frames_per_update * (u + 1) for u in range(3)]
    with open(out / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["step"]) for row in rows] == [row["step"] for row in runs[0]["history"]]  # written once
    checkpoints = [p.name for p in (out / "run" / "checkpoints").iterdir() if p.name.startswith("step_")]
    assert checkpoints == [f"step_{ARGS['total_frames']:08d}"]


def test_rank_seeds_differ():
    """Each rank samples its own actions, and a restart at other frames draws new ones."""
    from chronomem.rl.ppo import rank_seed

    assert len({rank_seed(1, 0, 0), rank_seed(1, 1, 0), rank_seed(1, 0, 512), rank_seed(2, 0, 0)}) == 4
