"""Weights written to and read from a checkpoint: every tensor, on any device, whatever memory it shares."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from chronomem.train import CheckpointError
from chronomem.train.checkpoint import load_weights, save_checkpoint, weights_of


def flat_lstm(seed: int) -> nn.LSTM:
    """An LSTM whose weights are views into one flat buffer, as cuDNN keeps them on a GPU."""
    torch.manual_seed(seed)
    lstm = nn.LSTM(3, 4, num_layers=2)
    flat = torch.cat([p.detach().reshape(-1) for p in lstm.parameters()])
    offset = 0
    for name, p in list(lstm.named_parameters()):
        view = flat[offset : offset + p.numel()].view_as(p)
        setattr(lstm, name, nn.Parameter(view))  # a view: no name covers the whole buffer
        offset += p.numel()
    return lstm


class Tied(nn.Module):
    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(5, 4)
        self.out = nn.Linear(4, 5, bias=False)
        self.out.weight = self.embed.weight


def test_weights_that_are_views_into_one_buffer_round_trip(tmp_path):
    saved = flat_lstm(0)
    assert len({p.untyped_storage().data_ptr() for p in saved.parameters()}) == 1  # the case of a GPU's LSTM
    save_checkpoint(tmp_path, 1, saved, {"step": 1})
    loaded = flat_lstm(1)
    load_weights(tmp_path, loaded)
    for (name, a), (_, b) in zip(saved.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_tied_weight_is_stored_once_and_loaded_through_both_names(tmp_path):
    saved = Tied(0)
    assert list(weights_of(saved)) == ["embed.weight"]
    save_checkpoint(tmp_path, 1, saved, {"step": 1})
    loaded = Tied(1)
    load_weights(tmp_path, loaded)
    assert torch.equal(loaded.out.weight, saved.out.weight) and loaded.out.weight is loaded.embed.weight


def test_weights_of_another_shape_are_a_checkpoint_error(tmp_path):
    save_checkpoint(tmp_path, 1, nn.Linear(3, 4), {"step": 1})
    with pytest.raises(CheckpointError, match="do not match the model"):
        load_weights(tmp_path, nn.Linear(3, 5))
