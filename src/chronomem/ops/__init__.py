"""Fused kernels behind the mechanisms, each beside a naive reference of the same function."""
