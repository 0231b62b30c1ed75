"""Hit-rate records are planning-library code (numpy only): hotsplit_cli/hotset/windows.py."""

from hotsplit_cli.hotset.windows import HitRateRecord

__all__ = ["HitRateRecord"]
