"""Payload models, one module per work kind (each owned by the worker that added the kind)."""
