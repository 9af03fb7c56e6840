"""Finished kernels, one module per lesson. Each launcher has its reference's signature."""
