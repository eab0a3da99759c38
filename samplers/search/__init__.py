"""Inference-time noise search (random, zero-order, search over paths) and its verifiers.

A verifier takes its scorer as an argument; nothing here imports a model package.
"""
