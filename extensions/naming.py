"""Derived names (seed 000, Input): one place turns the answers into every identifier."""

from __future__ import annotations


def camel(upper_snake: str) -> str:
    """`NOTIFY_SHIPMENT` -> `NotifyShipment`; `NOOP` -> `Noop` (seed 000, Input)."""
    return "".join(part.capitalize() for part in upper_snake.split("_") if part)


def derive_names(*, worker_name: str, work_kind: str) -> dict[str, str]:
    """Every name the template derives from `worker_name` and `work_kind`.

    Returns a dict of context variables: `worker_module` (`shipment_notifier`),
    `worker_env_prefix` (`SHIPMENT_NOTIFIER_`), `kind_class` (`NotifyShipment`),
    `kind_snake` (`notify_shipment`), `handler_class` (`NotifyShipmentHandlerImpl`),
    `payload_class` (`NotifyShipmentPayload`), `kind_value` (`notify_shipment`).
    """
    module = worker_name.replace("-", "_")
    kind_class = camel(work_kind)
    return {
        "worker_module": module,
        "worker_env_prefix": module.upper() + "_",
        "kind_class": kind_class,
        "kind_snake": work_kind.lower(),
        "handler_class": f"{kind_class}HandlerImpl",
        "payload_class": f"{kind_class}Payload",
    }
