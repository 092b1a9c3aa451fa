"""SiT and SiT + TLB: self-supervised vision Transformers (paper 003 Sec. 4.1, "Self Supervised Learning",
Fig. 2), for the ``ssl`` experiment.

SiT (Ahmed et al. 2021, "SiT: Self-supervised vIsion Transformer") pretrains a ViT with three objectives
at once, on two augmented views of every image:

1. **Reconstruction**: the view is rotated and then corrupted. The model reconstructs the clean rotated
   view from every patch's output (a linear map per patch to its pixels, which is what the authors'
   ConvTranspose with kernel = stride = patch size computes). The loss is L1 over all pixels.
2. **Rotation prediction**: each view is rotated by 0, 90, 180 or 270 degrees, drawn uniformly and
   apart for the two views. A learnable *rotation token* goes in front of the patches, and a linear
   head on its output predicts the rotation (cross-entropy).
3. **Contrastive**: a learnable *contrastive token*; a linear head on its output gives a projection, and
   NT-Xent (SimCLR) with temperature 0.5 pulls the two corrupted views of an image together and pushes
   the other images of the batch away.

The three losses are weighted by learned uncertainties (Kendall et al. 2018, as in the authors'
first release): ``sum_i adj_i exp(-s_i) L_i + s_i / 2``, with ``s_i`` starting at 0 (weight 1), and
``adj = 0.5`` for the reconstruction and 1 for the other two.

**SiT + TLB** (paper 003): the patches go through a TLB (``chronomem.tlb``, non-causal, chunks of 20
patches) instead of the ViT encoder, without the two tokens. "We take the mean across the temporal
latent bottleneck state vectors and use the resulting representation for computing the rotation and
contrastive objectives": ``TLB.summary``, the mean of the normalised state vectors after the last chunk.
The reconstruction reads the TLB's patch outputs.

The views (``augment``): a random resized crop (area 8-100%, aspect 3/4-4/3) back to the image size, a
horizontal flip with probability 1/2, and brightness and contrast jitter of 0.4 (with saturation 0.4 on
colour images), as the authors' view transform. The corruption (``corrupt``), as the authors' first
release draws it for every image: one random block turned grey (colour images), one random block
blurred (Gaussian, kernel 3-15, sigma 0.1-5.1), blocks of N(0, 1) noise until a share U(0, 0.3) of the
image is covered, and blocks up to 30% of the image replaced by the same region of another image of the
batch. Blocks are rectangles of 5-25% of a side (not aligned to patches).

Deviations: the authors' ViT-B/16 at 224 x 224 with drop-path is replaced by the repo's encoders at a
CPU size (``chronomem.experiments.ssl`` gives the sizes); no model EMA, AMP or repeated-augmentation
sampler; hue jitter is left out; the jitter's operations run in a fixed order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from chronomem.checks import check_positive
from chronomem.encoders import PatchEncoder
from chronomem.registry import build_backbone
from chronomem.tasks.images import patchify

__all__ = ["SiT", "SiTOutput", "augment", "corrupt", "nt_xent", "pretraining_losses", "rotate", "unpatchify"]

ROTATIONS = 4  # 0, 90, 180, 270 degrees
TEMPERATURE = 0.5  # NT-Xent's, as the authors'
# the uncertainty weighting's adjustment per loss (authors' first release): reconstruction, rotation, contrastive
LOSS_ADJUST = (0.5, 1.0, 1.0)
BACKBONES = ("vit", "tlb")


# --------------------------------------------------------------------------------------------
# Views, rotations, corruption (images: float [B, C, H, H] in [-1, 1])
# --------------------------------------------------------------------------------------------


def rotate(images: Tensor, quarters: Tensor) -> Tensor:
    """Each image turned counter-clockwise by ``quarters [B]`` x 90 degrees (0-3)."""
    out = images.clone()
    for k in range(1, ROTATIONS):
        rows = quarters == k
        if bool(rows.any()):
            out[rows] = torch.rot90(images[rows], k, dims=(-2, -1))
    return out


def _uniform(n: int, low: float, high: float, generator: torch.Generator) -> Tensor:
    return low + (high - low) * torch.rand(n, generator=generator)


def augment(images: Tensor, generator: torch.Generator) -> Tensor:
    """One random view of every image (module docstring): resized crop, flip, brightness/contrast jitter."""
    b, c, h, w = images.shape
    area = _uniform(b, 0.08, 1.0, generator)
    ratio = torch.exp(_uniform(b, math.log(3 / 4), math.log(4 / 3), generator))
    width, height = (area * ratio).sqrt().clamp(max=1.0), (area / ratio).sqrt().clamp(max=1.0)
    # the crop's centre, in [-1, 1] coordinates, where the crop lies inside the image
    cx = (1 - width) * (2 * torch.rand(b, generator=generator) - 1)
    cy = (1 - height) * (2 * torch.rand(b, generator=generator) - 1)
    flip = torch.where(torch.rand(b, generator=generator) < 0.5, -1.0, 1.0)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2], theta[:, 1, 1], theta[:, 1, 2] = width * flip, cx, height, cy
    grid = F.affine_grid(theta.to(images), [b, c, h, w], align_corners=False)
    view = F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
    x = (view + 1) / 2  # [0, 1] for the jitter
    x = x * _uniform(b, 0.6, 1.4, generator).view(b, 1, 1, 1).to(x)  # brightness
    mean = _luminance(x).mean((2, 3), keepdim=True)
    x = (x - mean) * _uniform(b, 0.6, 1.4, generator).view(b, 1, 1, 1).to(x) + mean  # contrast
    if c == 3:  # saturation
        grey = _luminance(x)
        x = grey + (x - grey) * _uniform(b, 0.6, 1.4, generator).view(b, 1, 1, 1).to(x)
    return x.clamp(0, 1) * 2 - 1


def _luminance(x: Tensor) -> Tensor:
    """``[B, 1, H, W]``: a grey image's own value, or a colour image's luminance (ITU-R 601 weights)."""
    if x.shape[1] == 1:
        return x
    return (x * x.new_tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)


MAX_BLOCKS = 64  # blocks drawn per image for each "until covered" corruption (the share is met long before)


def _blocks(batch: int, count: int, side: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``count`` random rectangles per image of 5-25% of the side in each direction (the authors'
    blocks), anywhere in the image: their corners and sizes ``[B, count, 2]`` (row, column)."""
    low, high = max(1, round(0.05 * side)), max(1, round(0.25 * side))
    size = torch.randint(low, high + 1, (batch, count, 2), generator=generator)
    corner = (torch.rand(batch, count, 2, generator=generator) * (side - size + 1)).long()
    return corner, size


def _painted(corner: Tensor, size: Tensor, side: int, laid: Tensor | None = None) -> Tensor:
    """``[B, H, W]``: the union of the rectangles (those ``laid [B, count]``, if given)."""
    at = torch.arange(side)
    inside = (at >= corner[..., None]) & (at < (corner + size)[..., None])  # [B, count, 2, side]
    if laid is not None:
        inside = inside & laid[..., None, None]
    rows, cols = inside[:, :, 0].float(), inside[:, :, 1].float()
    return torch.einsum("bkh,bkw->bhw", rows, cols) > 0  # some block covers (h, w)


def _until_covered(batch: int, side: int, share: float, generator: torch.Generator) -> Tensor:
    """``[B, H, W]``: the union of blocks laid one after another until they add up to a share U(0, share)
    of the image (an image's blocks are counted by area, overlaps included, as the authors')."""
    corner, size = _blocks(batch, MAX_BLOCKS, side, generator)
    target = _uniform(batch, 0.0, share, generator)[:, None] * side * side
    areas = size.prod(-1)
    laid = (areas.cumsum(1) - areas) < target  # a block is laid while the ones before cover too little
    return _painted(corner, size, side, laid)


def _gaussian_blur(images: Tensor, kernels: Tensor, sigmas: Tensor) -> Tensor:
    """Each image ``[B, C, H, W]`` blurred by its own separable Gaussian (odd ``kernels [B]``, ``sigmas
    [B]``; reflect padding, replicate on images smaller than the widest kernel)."""
    b, c, h, w = images.shape
    widest = int(kernels.max())
    t = torch.arange(widest, dtype=images.dtype) - (widest - 1) / 2
    g = torch.exp(-0.5 * (t / sigmas[:, None].to(images.dtype)) ** 2) * (t.abs() <= (kernels[:, None] - 1) / 2)
    g = (g / g.sum(1, keepdim=True)).to(images.device).repeat_interleave(c, 0)  # [B * C, widest]
    pad = widest // 2
    x = F.pad(images.reshape(1, b * c, h, w), (pad,) * 4, mode="reflect" if pad < min(h, w) else "replicate")
    x = F.conv2d(x, g.view(b * c, 1, 1, widest), groups=b * c)
    x = F.conv2d(x, g.view(b * c, 1, widest, 1), groups=b * c)
    return x.view(b, c, h, w)


def corrupt(images: Tensor, generator: torch.Generator) -> Tensor:
    """The images with the authors' corruptions (module docstring), each image drawn apart, in their
    order: a grey block (colour images), a blurred block, noise blocks, blocks of another image of the
    batch (drawn from the batch)."""
    b, c, side, _ = images.shape
    out = images
    device = images.device
    if c == 3:
        grey = _painted(*_blocks(b, 1, side, generator), side)[:, None].to(device)
        out = torch.where(grey, out.mean(1, keepdim=True), out)
    blurred = _painted(*_blocks(b, 1, side, generator), side)[:, None].to(device)
    kernels = 2 * torch.randint(1, 8, (b,), generator=generator) + 1  # 3, 5, ..., 15
    out = torch.where(blurred, _gaussian_blur(out, kernels, _uniform(b, 0.1, 5.1, generator)), out)
    noise = _until_covered(b, side, 0.3, generator)[:, None].to(device)
    out = torch.where(noise, torch.randn(out.shape, generator=generator).to(out), out)
    if b > 1:
        other = (torch.arange(b) + 1 + torch.randint(b - 1, (b,), generator=generator)) % b
        replaced = _until_covered(b, side, 0.3, generator)[:, None].to(device)
        out = torch.where(replaced, images[other.to(device)], out)
    return out.clone() if out is images else out


def unpatchify(pixels: Tensor, channels: int, patch_size: int) -> Tensor:
    """``[B, N, C * p * p]`` patch pixels (``chronomem.tasks.images.patchify``'s order) -> ``[B, C, H, H]``."""
    b, n, _ = pixels.shape
    g = math.isqrt(n)
    if g * g != n:
        raise ValueError(f"pixels must hold a square grid of patches, got {n} patches")
    p = patch_size
    return pixels.reshape(b, g, g, channels, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, channels, g * p, g * p)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass
class SiTOutput:
    """``rotation [B, 4]`` logits, ``projection [B, P]`` (the contrastive head's), ``reconstruction
    [B, C, H, H]`` and ``features [B, K, dim]``: the representation the probe reads, the outputs the
    rotation and contrastive heads read (SiT: its two tokens, K = 2; SiT + TLB: the state's mean, K = 1)."""

    rotation: Tensor
    projection: Tensor
    reconstruction: Tensor
    features: Tensor


class SiT(nn.Module):
    """SiT (``backbone="vit"``) or SiT + TLB (``backbone="tlb"``) over images ``[B, C, H, H]`` in [-1, 1]
    (module docstring). ``chunk_size`` and ``num_state`` are TLB's (paper 003: chunks of 20)."""

    def __init__(self, channels: int, image_size: int, patch_size: int, dim: int, depth: int, num_heads: int,
                 backbone: str = "vit", ff_mult: float = 2.0, projection_dim: int = 128, chunk_size: int = 20,
                 num_state: int = 5):
        super().__init__()
        if backbone not in BACKBONES:
            raise ValueError(f"backbone must be one of {BACKBONES}, got {backbone!r}")
        if check_positive(image_size, "image_size") % check_positive(patch_size, "patch_size"):
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size}")
        self.channels, self.patch_size, self.backbone_name = channels, patch_size, backbone
        self.encoder = PatchEncoder(channels, patch_size, dim, grid=image_size // patch_size)
        if backbone == "vit":
            self.backbone = build_backbone("vit", dim=dim, depth=depth, num_heads=num_heads, causal=False,
                                           ff_mult=ff_mult)
            # the rotation and contrastive tokens, before the patches (truncated normal, std 0.02, as SiT's)
            self.tokens = nn.Parameter(nn.init.trunc_normal_(torch.empty(2, dim), std=0.02))
        else:
            self.backbone = build_backbone("tlb", dim=dim, depth=depth, num_heads=num_heads, causal=False,
                                           ff_mult=ff_mult, chunk_size=chunk_size, num_state=num_state,
                                           self_per_cross=1)
        self.rotation_head = nn.Linear(dim, ROTATIONS)
        self.contrastive_head = nn.Linear(dim, check_positive(projection_dim, "projection_dim"))
        self.reconstruction_head = nn.Linear(dim, channels * patch_size * patch_size)
        self.log_variances = nn.Parameter(torch.zeros(3))  # s_i of the uncertainty weighting

    def forward(self, images: Tensor) -> SiTOutput:
        if not isinstance(images, Tensor) or images.dim() != 4 or images.shape[1] != self.channels:
            shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
            raise ValueError(f"images must be [B, {self.channels}, H, H] in [-1, 1], got {shape}")
        x = self.encoder(patchify(images, self.patch_size))
        if self.backbone_name == "vit":
            y, _ = self.backbone(torch.cat([self.tokens.expand(x.shape[0], -1, -1).to(x), x], 1))
            features, patches = y[:, :2], y[:, 2:]
            rotation, contrast = features[:, 0], features[:, 1]
        else:
            patches, state = self.backbone(x)
            summary = self.backbone.summary(patches, state)
            features, rotation, contrast = summary[:, None], summary, summary
        reconstruction = unpatchify(self.reconstruction_head(patches), self.channels, self.patch_size)
        return SiTOutput(self.rotation_head(rotation), self.contrastive_head(contrast), reconstruction, features)


def nt_xent(z1: Tensor, z2: Tensor, temperature: float = TEMPERATURE) -> Tensor:
    """SimCLR's NT-Xent (Chen et al. 2020): ``z1[i]`` and ``z2[i]`` are the two views of image ``i``; each
    of the 2B views has its other view as the positive and the 2B - 2 others as negatives (cosine
    similarity / temperature, cross-entropy), averaged over the 2B views."""
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"z1 and z2 must be [B, P] of one shape, got {tuple(z1.shape)} and {tuple(z2.shape)}")
    z = F.normalize(torch.cat([z1, z2]), dim=-1)
    b = z1.shape[0]
    logits = z @ z.T / temperature
    logits = logits.masked_fill(torch.eye(2 * b, dtype=torch.bool, device=z.device), float("-inf"))
    positives = torch.cat([torch.arange(b, 2 * b), torch.arange(b)]).to(z.device)
    return F.cross_entropy(logits, positives)


def pretraining_losses(model: SiT, images: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
    """SiT's three losses on a batch ``images [B, C, H, H]`` (float in [-1, 1]) and their weighted sum
    (``"loss"``; module docstring). The random draws (views, rotations, corruption) come from
    ``generator``."""
    b = images.shape[0]
    views = torch.cat([augment(images, generator), augment(images, generator)])
    quarters = torch.randint(ROTATIONS, (2 * b,), generator=generator).to(images.device)
    clean = rotate(views, quarters)
    out = model(corrupt(clean, generator))
    losses = {"reconstruction": F.l1_loss(out.reconstruction, clean),
              "rotation": F.cross_entropy(out.rotation, quarters),
              "contrastive": nt_xent(out.projection[:b], out.projection[b:])}
    s = model.log_variances
    total = sum(adjust * torch.exp(-s[i]) * loss + 0.5 * s[i]
                for i, (adjust, loss) in enumerate(zip(LOSS_ADJUST, losses.values(), strict=True)))
    return {**losses, "loss": total}
