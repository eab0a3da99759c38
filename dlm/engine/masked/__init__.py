"""The masked-diffusion family (LLaDA, Dream, LLaDA2, block diffusion, tiny-dlm)."""
