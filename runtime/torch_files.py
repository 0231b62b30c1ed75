"""Reading `.pt` files safely (tensors, numbers, strings, lists and dicts only), and writing them.

`torch.load(weights_only=True)` refuses any pickled object that is not one of those, so a
routing dump from a serving engine can be read without running code from it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch

from hotsplit_cli.core.errors import InputFileError
from hotsplit_cli.core.jsonio import write_atomic


def load_tensors_only(path: str | Path) -> object:
    """The contents of a `.pt` file, refused (InputFileError) unless it is tensors-only."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputFileError(
            f"{path}: refused: not a tensors-only torch file ({first[:160]})",
            "hotsplit reads .pt files with weights_only=True and never unpickles arbitrary objects",
        ) from None


def save_tensors(path: str | Path, arrays: dict) -> None:
    """`arrays` (name -> numpy array) as a `.pt` dict of tensors, written atomically."""
    doc = {name: torch.from_numpy(a) for name, a in arrays.items()}
    write_atomic(path, lambda fh: torch.save(doc, fh))
