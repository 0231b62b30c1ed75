"""Router lookahead measured by `balance --model`: the counters it records in hist.json equal an
independent computation from the hidden states plain transformers captures on the same prompts.

Families: mixtral (softmax router, no shared expert), qwen2_moe (a gated shared expert in the
residual) and deepseek_v3 (a shared expert, a dense first layer, a group-limited sigmoid router
with a correction bias). The weights are random: the recall checks the counters, not the predictor.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", minversion="5.0", reason="transformers>=5 (hotsplit[hf])")

from hotsplit_runtime.hf.capture import count_routing  # noqa: E402
from hotsplit_runtime.hf.loader import FAMILIES as ALL_FAMILIES  # noqa: E402

from hotsplit_cli.hotset.lookahead import load_lookahead  # noqa: E402
from hotsplit_cli.traffic.hist import load_hist  # noqa: E402
from tests.fakes.hf import SENTENCES, build_checkpoint, reference  # noqa: E402

FAMILIES = ("mixtral", "qwen2_moe", "deepseek_v3")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookahead")
    folders = {f: build_checkpoint(root / f, f) for f in FAMILIES}
    _with_correction_bias(folders["deepseek_v3"])
    return folders


def _with_correction_bias(folder) -> None:
    """A correction bias as large as the scores (the tiny checkpoint saves zeros), so that ranking
    by the sigmoid alone would guess other experts."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    gen = torch.Generator().manual_seed(3)
    for key in [k for k in tensors if k.endswith("e_score_correction_bias")]:
        tensors[key] = torch.rand(tensors[key].shape, generator=gen) - 0.5
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def routers(model) -> dict[int, torch.nn.Module]:
    """Decoder layer index -> its MoE block's router, found by name (not by hotsplit's adapter)."""
    return {int(name.split(".")[2]): mod for name, mod in model.named_modules()
            if name.startswith("model.layers.") and name.endswith(("mlp.gate", "mlp.router"))}


def ranked(router, x_TH: torch.Tensor, config) -> torch.Tensor:
    """Every expert ranked by hand: the top_k the routing rule selects, then the others by score."""
    logits = x_TH.float() @ router.weight.float().T
    bias = getattr(router, "e_score_correction_bias", None)
    score = logits if bias is None else logits.sigmoid() + bias
    selectable = torch.ones_like(score, dtype=torch.bool)
    if bias is not None:  # group-limited: the topk_group groups with the best top-2 sums
        groups = score.view(len(score), config.n_group, -1)
        best = groups.topk(2, dim=-1).values.sum(-1).topk(config.topk_group, dim=-1).indices
        selectable = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, best[..., None].expand(
            -1, -1, groups.shape[-1]), True).view_as(score)
    K = config.num_experts_per_tok
    top = score.masked_fill(~selectable, float("-inf")).topk(K, dim=-1).indices
    rest = score.scatter(1, top, float("-inf")).argsort(dim=-1, descending=True, stable=True)[:, :-K]
    return torch.cat([top, rest], dim=1)


def independent_counts(folder, prompts: list[str], guesses: int) -> dict[int, tuple[int, int]]:
    """Predicted layer -> (tokens, useful): each prompt alone through plain transformers (prefill),
    the hidden state of every decoder layer captured, the next MoE layer's routing captured."""
    from transformers import AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), reference(folder)
    layers = model.model.layers
    gates = routers(model)
    moe = sorted(gates)
    counts = {lid: [0, 0] for lid in moe[1:]}
    routed = {}
    hooks = [g.register_forward_hook(lambda m, a, out, lid=lid: routed.__setitem__(lid, out[2]))
             for lid, g in gates.items()]
    for text in prompts:
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states  # [0]: embeddings
        for before, lid in zip(moe, moe[1:], strict=False):
            h = hidden[before + 1][0]  # the output of MoE layer `before`'s decoder layer
            guess = ranked(gates[lid], layers[lid].post_attention_layernorm(h), model.config)[:, :guesses]
            hit = (routed[lid][:, :, None] == guess[:, None, :]).any(-1)
            counts[lid][0] += len(h)
            counts[lid][1] += int(hit.sum())
    for hk in hooks:
        hk.remove()
    return {lid: tuple(c) for lid, c in counts.items()}


@pytest.mark.parametrize("family, guesses", [("mixtral", 2), ("mixtral", 5), ("qwen2_moe", 4),
                                             ("deepseek_v3", 3), ("deepseek_v3", 6)])
def test_recorded_lookahead_equals_an_independent_computation(cli, ckpts, tmp_path, family, guesses):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join(SENTENCES[:3]) + "\n")
    out = tmp_path / "h.json"
    r = cli("balance", "--model", ckpts[family], "--prompts", prompts, "--max-new-tokens", "0",
            "--batch-size", "1", "--prefetch-guesses", str(guesses), "-o", out)
    assert r.code == 0, r.err
    hist = load_hist(out)
    look = load_lookahead(hist, str(out))
    expect = independent_counts(ckpts[family], SENTENCES[:3], guesses)
    assert {x.layer: (x.tokens, x.useful) for x in look.layers} == expect
    K = 2  # every tiny family routes top-2
    for x in look.layers:
        assert x.guesses == x.tokens * guesses and x.routed == x.tokens * K
    assert [x.after for x in look.layers] == list(hist.layers[:-1])  # each read one MoE layer early
    useful, routed = sum(u for _, u in expect.values()), sum(t for t, _ in expect.values()) * K
    assert look.recall == pytest.approx(useful / routed)
    assert look.guesses_per_token == guesses and family in look.measured_on
    assert f"router lookahead: recall {100 * useful / routed:.1f}% at {guesses} guesses per token" in r.out
    assert json.loads(out.read_text())["lookahead"]["overall"]["useful"] == useful


def test_widening_to_every_expert_covers_every_routed_one(cli, ckpts, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text(SENTENCES[0] + "\n")
    out = tmp_path / "h.json"
    r = cli("balance", "--model", ckpts["qwen2_moe"], "--prompts", prompts, "--max-new-tokens", "2",
            "--prefetch-guesses", "99", "-o", out)
    assert r.code == 0, r.err
    look = load_lookahead(load_hist(out), str(out))
    assert look.guesses_per_token == 8 and look.recall == 1.0  # capped at the 8 experts of a layer
    assert all(x.wasted == x.tokens * 6 for x in look.layers)


def test_the_knob_is_refused_in_one_line_before_anything_is_read(cli, ckpts, tmp_path):
    out = tmp_path / "h.json"
    r = cli("balance", "--model", ckpts["mixtral"], "--prompts", tmp_path / "missing.txt",
            "--prefetch-guesses", "0", "-o", out)
    assert r.code == 2 and r.err.strip() == "error: --prefetch-guesses: must be >= 1, got 0"
    r = cli("balance", "tiny", "--prefetch-guesses", "4", "-o", out)
    assert r.code == 2 and r.err.startswith("error: --prefetch-guesses: router lookahead is measured on a checkpoint;")
    assert not out.exists()


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_every_family_counts_the_routing_counters_tokens_and_full_width_covers_all(checkpoints, family):
    """Every supported family: each MoE layer after the first predicted from the one before, over
    the tokens the routing counter counted (padding and finished sequences excluded); guessing
    every expert covers every routed one, the router's own top-k alone fewer."""
    from tests.conftest import cpu_without_triton

    cpu = cpu_without_triton()
    prompts = [SENTENCES[0], "Hi"]  # batched together: the short one is left-padded
    full = count_routing(checkpoints[family], cpu, None, prompts, 3, 2, False, guesses=99)
    assert [x.layer for x in full.lookahead.layers] == list(full.layer_ids[1:])
    assert {x.tokens for x in full.lookahead.layers} == {full.tokens}
    assert full.lookahead.guesses_per_token == 8 and full.lookahead.recall == 1.0
    strict = count_routing(checkpoints[family], cpu, None, prompts, 3, 2, False, guesses=full.top_k)
    assert strict.lookahead.recall < 1.0 and strict.lookahead.total("useful") <= strict.lookahead.total("routed")
