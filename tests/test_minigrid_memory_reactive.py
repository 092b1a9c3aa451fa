"""benchmarks/minigrid_memory_reactive.py: MiniGrid's Memory cue is in view from the junction in S7 and
not in S13, and a policy that reads only the current view passes S7 and stays at a coin flip on S13."""

import json

import pytest

from helpers import load_benchmark

pytest.importorskip("gymnasium")
pytest.importorskip("minigrid")

reactive = load_benchmark("minigrid_memory_reactive")


def test_the_cue_is_in_view_from_the_junction_only_in_the_small_rooms():
    assert reactive.cue_in_view(reactive.reset_env(7))
    assert not reactive.cue_in_view(reactive.reset_env(13))


def test_the_check_catches_a_policy_that_reads_what_the_view_hides():
    def reads_the_hidden_answer(env, p_forward):
        if tuple(int(v) for v in env.agent_pos) == reactive.junction(env) and env.agent_dir == reactive.WEST:
            return {reactive.RIGHT: 1.0} if env.success_pos[1] < env.height // 2 else {reactive.LEFT: 1.0}
        return reactive.policy(env, p_forward)

    assert reactive.view_determined(7) and reactive.view_determined(13)
    assert reactive.view_determined(7, acting=reads_the_hidden_answer)  # the view holds the cue there
    assert not reactive.view_determined(13, acting=reads_the_hidden_answer)


def test_the_memoryless_policy_passes_s7_and_not_s13(tmp_path):
    out = tmp_path / "reactive.json"
    result = reactive.main(["--episodes", "40", "--p-forward", "0.1", "--sizes", "7", "13", "--json", str(out)])
    assert result["sizes"]["7"]["play"]["0.1"]["success"] >= 0.8
    assert result["sizes"]["13"]["play"]["0.1"]["success"] <= 0.7
    assert json.loads(out.read_text()) == result
    with pytest.raises(FileExistsError):
        reactive.main(["--episodes", "1", "--sizes", "7", "--json", str(out)])


@pytest.mark.parametrize("argv", [["--episodes", "0"], ["--p-forward", "0"], ["--p-forward", "1.5"], ["--sizes", "8"]])
def test_bad_input_is_refused_by_name(argv):
    with pytest.raises(ValueError, match=argv[0]):
        reactive.main(argv)
