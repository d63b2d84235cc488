"""Typed enqueue helpers, one module per kind (`enqueuers/<kind_snake>.py`).

Each module takes the kind's payload model and builds the `WorkItem` itself, so a caller
never spells the kind, the lane or `max_attempts` by hand. Rendered per worker and owned
by the template: edit the payload model, not these.
"""
