"""Floating-point operations of one pass, counted by torch (used by ``benchmarks/listops_inference.py``)."""

from __future__ import annotations


def count_flops(model, x) -> int:
    """Floating-point operations of one inference pass ``model(x)``: matmuls and attention, counted by
    ``torch.utils.flop_counter`` (2 per multiply-add; elementwise work is not counted). The counter
    knows the CUDA attention kernels; SDPA on a CPU dispatches to an op it does not, mapped here."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    def cpu_attention(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    mapping = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: cpu_attention}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        model(x)
    return counter.get_total_flops()
