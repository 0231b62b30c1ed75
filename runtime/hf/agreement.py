"""How far a checkpoint run at a stored precision (fp8, mxfp4) strays from the checkpoint as
released: the teacher-forced next-token agreement of the run's own greedy tokens with the
checkpoint loaded at its own precision.

Once the run is over (its banks freed), the checkpoint is loaded again as released and each
prompt, followed by the tokens the run generated for it, is one forward pass; a generated token
agrees where the native model's greedy choice at its position is that token. Teacher-forced: the
native model reads the run's tokens after a first disagreement too, so one early miss is one
miss, not every later token. The cost is one more load and one forward per prompt.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hotsplit_cli.core.errors import HotsplitError

from ..device import DeviceInfo
from ..request import Agreement
from .capture import prompt_text
from .loader import load_model, load_tokenizer


@torch.no_grad()
def native_agreement(path: str | Path, info: DeviceInfo, dtype: torch.dtype, prompts: list,
                     generated: list[list[int]]) -> Agreement:
    """The fraction of `generated` tokens (per prompt, as the run chose them) that the checkpoint
    at its own precision also chooses, fed each prompt and the run's tokens before it. A native
    load the machine cannot hold is reported, not raised: the run itself succeeded."""
    try:
        hm = load_model(path, info, dtype)
    except HotsplitError as exc:
        return Agreement(None, 0, f"the checkpoint as released could not be loaded to compare: {exc}")
    tok = load_tokenizer(path)
    agree = total = 0
    for prompt, gen_G in zip(prompts, generated, strict=True):
        if not gen_G:
            continue
        ids = tok(prompt_text(tok, prompt), return_tensors="pt")["input_ids"][0].tolist()
        seq_S = torch.tensor([ids + gen_G], device=info.device)
        logits_SV = hm.model(input_ids=seq_S).logits[0]
        chosen_G = logits_SV[len(ids) - 1:len(ids) - 1 + len(gen_G)].argmax(-1).cpu()
        agree += int((chosen_G == torch.tensor(gen_G)).sum())
        total += len(gen_G)
    return Agreement(agree / total if total else None, total, None if total else "no token was generated")
