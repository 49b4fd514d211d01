"""Kyutai Moshi architecture (Moshi, PersonaPlex): LM, Mimi codec, checkpoints."""
