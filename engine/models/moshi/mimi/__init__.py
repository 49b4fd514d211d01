"""Mimi, Kyutai's streaming speech codec: SEANet convolutions, transformers, split RVQ."""
