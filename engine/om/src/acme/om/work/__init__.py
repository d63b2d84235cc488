from .manager import WorkManagerInterface

__all__ = ["WorkManagerInterface"]
