"""The dLLM decoding engine: the families' loops and what they share (see `dlm.generation` for the
front door, `dlm.generate`)."""
