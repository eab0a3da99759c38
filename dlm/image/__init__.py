"""Image diffusion on the 8x8 digits: conditional transformer, classifiers, metrics."""
