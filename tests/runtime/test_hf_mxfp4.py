"""gpt-oss as released: a checkpoint whose routed experts are MXFP4 `*_blocks` / `*_scales` loads
as it is and stays mxfp4 in the banks (hot copies the same bytes), generating the greedy text that
transformers generates from it dequantised."""

import numpy as np
import pytest
import torch
from hotsplit_runtime.device import choose_device
from hotsplit_runtime.hf.loader import load_model, load_tokenizer

from tests.fakes.hf import mxfp4_release

pytest.importorskip("transformers", minversion="5.0")


@pytest.fixture(scope="module")
def release(checkpoints, tmp_path_factory):
    return mxfp4_release(checkpoints["gpt_oss"], tmp_path_factory.mktemp("mxfp4") / "gpt_oss")


def test_a_gpt_oss_mxfp4_release_generates_what_transformers_generates_from_it_dequantised(release):
    from transformers import AutoModelForCausalLM, Mxfp4Config

    tok = load_tokenizer(release)
    batch = tok(["the cold expert", "a hot bank of"], return_tensors="pt", padding=True, padding_side="left")
    kw = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6, do_sample=False,
              pad_token_id=tok.pad_token_id)
    ref = AutoModelForCausalLM.from_pretrained(release, dtype=torch.float32,
                                               quantization_config=Mxfp4Config(dequantize=True)).eval()
    want = ref.generate(**kw)
    hm = load_model(release, choose_device("cpu"), torch.float32)
    assert {b.precision for b in hm.banks} == {"mxfp4"} and hm.banks[0].cold_EB.dtype == torch.uint8
    for bank in hm.banks:
        bank.set_hot(np.arange(hm.num_experts) % 3 == 0)
    hm.counter.begin_step(None)
    assert hm.model.generate(**kw).tolist() == want.tolist()
    for bank in hm.banks:  # a swap copies the stored bytes: the text does not change
        bank.swap(0, 1)
        assert torch.equal(bank.hot_SB[bank.table.expert2slot_E[1]], bank.cold_EB[1])
    hm.counter.begin_step(None)
    assert hm.model.generate(**kw).tolist() == want.tolist()


def test_mxfp4_declared_over_experts_that_are_not_is_refused_naming_the_tensor(checkpoints, tmp_path):
    """A config that says mxfp4 over a checkpoint of plain experts: the experts cannot be read."""
    import json
    import shutil

    from hotsplit_cli.core.errors import InputFileError

    folder = tmp_path / "declared"
    shutil.copytree(checkpoints["gpt_oss"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputFileError, match=r"experts\.down_proj: w2 of expert 0: shape \(64, 32\), the model's "
                                             r"layout holds \(32, 2, 16\)"):
        load_model(folder, choose_device("cpu"), torch.float32)
