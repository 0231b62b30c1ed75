"""The one loop's windows are planning-library code (numpy only): hotsplit_cli/hotset/windows.py."""

from hotsplit_cli.hotset.windows import RunSummary, WindowBook, moves_by_layer, validate_swaps

__all__ = ["RunSummary", "WindowBook", "moves_by_layer", "validate_swaps"]
