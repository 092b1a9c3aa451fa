"""BLRP (paper 002, Section 3) against a literal per-example loop over the paper's equations."""

from __future__ import annotations

import pytest
import torch

from chronomem.blrp import BLRP, BLRPLatents, build_blrp


def make(dtype=torch.float64, **options) -> BLRP:
    torch.manual_seed(0)
    kwargs = dict(dim=16, num_heads=2, segment_size=4, latent_size=3, depth=2)
    kwargs.update(options)
    return BLRP(**kwargs).to(dtype).eval()


def naive_blrp(model: BLRP, x: torch.Tensor):
    """Section 3 written out for ONE unpadded sequence ``x [N, D]``: segments as a Python list, the
    forward and backward passes as the equations' case distinctions, concatenations made explicitly.
    Returns ``(y [N, D], L_FINAL [l, D], L^F_T [l, D])``."""
    X = x[None]
    init_f, init_b = model.phi_forward(X, None), model.phi_backward(X, None)
    t = model.segment_size
    segments = [X[:, s : s + t] for s in range(0, X.shape[1], t)]  # the last one is simply shorter
    selfed = []
    for seg in segments:  # Theta_SELF within the segment, with the 1D position encoding
        h = seg + model.segment_encoding[: seg.shape[1]].to(x.dtype)
        for block in model.theta_self:
            h = block(h)
        selfed.append(h)
    T = len(segments)
    XF, LF = [], []
    for i in range(T):
        if i == 0:
            XF.append(model.theta_x(selfed[i], init_f))
            LF.append(model.theta_l(init_f, XF[i]))
        else:
            XF.append(model.theta_x(selfed[i], LF[i - 1]))
            LF.append(model.theta_l(LF[i - 1], torch.cat([XF[i], init_f], dim=1)))
    XB, LB = [None] * T, [None] * T
    for i in reversed(range(T)):
        if i == T - 1:
            XB[i] = model.theta_x(selfed[i], init_b)
            LB[i] = model.theta_l(LF[T - 1], torch.cat([XF[i], XB[i]], dim=1))
        else:
            XB[i] = model.theta_x(selfed[i], LB[i + 1])
            LB[i] = model.theta_l(LB[i + 1], torch.cat([XF[i], XB[i], init_b], dim=1))
    y = model.norm(torch.cat(XB, dim=1))
    return y[0], LB[0][0], LF[-1][0]


@pytest.mark.parametrize("projection", ["separate", "siamese", "identical"])
@pytest.mark.parametrize("segment_size,latent_size,depth", [(4, 3, 2), (5, 1, 1), (3, 6, 0)])
def test_batched_equals_naive_loop_over_the_equations(projection, segment_size, latent_size, depth):
    model = make(projection=projection, segment_size=segment_size, latent_size=latent_size, depth=depth)
    g = torch.Generator().manual_seed(1)
    lengths = [13, 4, 9, 1]  # several segments, exactly one segment, a partial one, a single token
    x = torch.randn(len(lengths), max(lengths), 16, generator=g, dtype=torch.float64)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    x = torch.where(mask[..., None], x, 100.0)  # garbage in the padding must not leak
    with torch.no_grad():
        y, latents = model(x, mask=mask)
        for b, n in enumerate(lengths):
            y_ref, final_ref, forward_ref = naive_blrp(model, x[b, :n])
            torch.testing.assert_close(y[b, :n], y_ref, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(latents.final[b], final_ref, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(latents.forward[b], forward_ref, rtol=1e-9, atol=1e-9)
            assert bool((y[b, n:] == 0).all())


def test_padding_invariance_of_l_final():
    model = make()
    x = torch.randn(2, 10, 16, dtype=torch.float64)
    padded = torch.cat([x, torch.randn(2, 7, 16, dtype=torch.float64)], dim=1)  # two more segments
    mask = torch.arange(17)[None, :].expand(2, -1) < 10
    with torch.no_grad():
        y, latents = model(x)
        y_pad, latents_pad = model(padded, mask=mask)
    torch.testing.assert_close(latents_pad.final, latents.final, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y_pad[:, :10], y, rtol=1e-10, atol=1e-10)
    assert bool((y_pad[:, 10:] == 0).all())


def test_both_directions_and_both_projections_are_used():
    model = make()
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    with torch.no_grad():
        _, latents = model(x)
        # Swapping the forward and backward Phi changes L_FINAL: they are different and both are read.
        fwd = {k: v.clone() for k, v in model.phi_forward.state_dict().items()}
        model.phi_forward.load_state_dict(model.phi_backward.state_dict())
        model.phi_backward.load_state_dict(fwd)
        _, swapped = model(x)
    assert not torch.allclose(latents.final, swapped.final)

    # Every token output depends on the whole sequence (the backward pass carries later segments back).
    x = x.clone().requires_grad_(True)
    y, latents = model(x)
    probe = torch.randn_like(y)  # a plain sum of LayerNorm outputs would be constant
    (grad_first_on_last,) = torch.autograd.grad((y[:, :4] * probe[:, :4]).sum(), x, retain_graph=True)
    assert grad_first_on_last[:, -1].abs().sum() > 0
    (grad_final_on_first,) = torch.autograd.grad((latents.final * torch.randn_like(latents.final)).sum(), x)
    assert grad_final_on_first[:, 0].abs().sum() > 0


def test_projection_options_share_what_they_say():
    separate, siamese, identical = (make(projection=p) for p in ("separate", "siamese", "identical"))
    assert separate.phi_forward.basis is not separate.phi_backward.basis
    assert siamese.phi_forward.basis is siamese.phi_backward.basis
    assert siamese.phi_forward.norm is not siamese.phi_backward.norm
    assert identical.phi_forward is identical.phi_backward


def test_gradients_reach_every_parameter_through_the_classifier_readout():
    model = make(dtype=torch.float32).train()
    x = torch.randn(3, 11, 16)
    y, latents = model(x)
    loss = model.summary(y, latents).pow(2).sum() + y.pow(2).mean()
    loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == []
    assert isinstance(latents, BLRPLatents) and latents.final.shape == (3, 3, 16)


def test_summary_is_the_mean_of_the_normed_final_block():
    model = make()
    y, latents = model(torch.randn(2, 9, 16, dtype=torch.float64))
    torch.testing.assert_close(model.summary(y, latents), model.norm_latent(latents.final).mean(1))


def test_bad_input():
    with pytest.raises(ValueError, match="segment_size"):
        BLRP(dim=16, num_heads=2, segment_size=0)
    with pytest.raises(ValueError, match="latent_size"):
        BLRP(dim=16, num_heads=2, latent_size=0)
    with pytest.raises(ValueError, match="num_heads"):
        BLRP(dim=16, num_heads=3)
    with pytest.raises(ValueError, match="projection"):
        BLRP(dim=16, num_heads=2, projection="shared")
    with pytest.raises(ValueError, match="causal"):
        build_blrp(16, 1, 2, causal=True)
    model = make()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        model(x[0])
    with pytest.raises(ValueError, match="last dimension 16"):
        model(torch.randn(2, 9, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="mask must have shape"):
        model(x, mask=torch.ones(2, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a boolean"):
        model(x, mask=torch.ones(2, 9))
    with pytest.raises(ValueError, match="state must be None"):
        _, latents = model(x)
        model(x, state=latents)
    with pytest.raises(ValueError, match="empty sequence"):
        model(x[:, :0])
