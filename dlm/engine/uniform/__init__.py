"""The uniform-noise family (DiffusionGemma)."""
