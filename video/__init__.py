"""video package: memory-lean inference for diffusers video models (Streamlined Inference)."""

from video.streamline import SUPPORTED, StreamlineConfig, rehash_tracker, streamline, unstreamline

__all__ = ["SUPPORTED", "StreamlineConfig", "rehash_tracker", "streamline", "unstreamline"]
