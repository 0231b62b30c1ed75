"""hist.json's `lookahead` block (hotset/lookahead.py): written as read, every derived figure
checked against the counters, and a bad block refused naming the field, before anything is written."""

from __future__ import annotations

import copy
import json

import pytest

from hotsplit_cli.core.errors import HistogramError
from hotsplit_cli.hotset.lookahead import LayerLookahead, Lookahead, load_lookahead
from hotsplit_cli.traffic.hist import hist_from_doc
from hotsplit_cli.traffic.predict import MeasuredRecall

# MoE layers 1, 2, 3; 10 tokens at 4 guesses, top-2
LOOK = Lookahead("olmoe checkpoint c: 10 tokens of 2 prompts, greedy", 4,
                 (LayerLookahead(2, 1, 10, 40, 15, 20), LayerLookahead(3, 2, 10, 40, 5, 20)))


def read(doc: dict) -> Lookahead | None:
    """The `lookahead` block of a histogram document, read as `plan` reads it."""
    return load_lookahead(hist_from_doc(doc, "h.json"), "h.json")


def hist_doc(**extra):
    return {"schema": "hotsplit.hist/1", "model": "m", "source": "s", "top_k": 2, "tokens": 10, "layers": [1, 2, 3],
            "num_experts": 8, "counts": [[5, 5, 5, 5, 0, 0, 0, 0]] * 3, **extra}


def test_the_block_is_written_as_it_is_read_and_priced_pooled():
    doc = LOOK.to_doc()
    assert doc["layers"][0] == {"layer": 2, "after": 1, "tokens": 10, "guesses": 40, "useful": 15, "wasted": 25,
                                "routed": 20, "recall": 0.75}
    assert doc["overall"] == {"tokens": 10, "guesses": 80, "useful": 20, "wasted": 60, "routed": 40, "recall": 0.5,
                              "wasted_per_useful": 3.0}
    hist = hist_from_doc(hist_doc(lookahead=json.loads(json.dumps(doc))), "h.json")
    assert load_lookahead(hist, "h.json") == LOOK and hist.to_doc()["lookahead"] == doc  # kept as read
    assert LOOK.measured() == MeasuredRecall(0.5, 3.0, 4, 10)
    assert read(hist_doc()) is None


def test_no_useful_guess_has_no_waste_ratio():
    none = Lookahead("m", 1, (LayerLookahead(2, 1, 3, 3, 0, 6), LayerLookahead(3, 2, 3, 3, 0, 6)))
    doc = none.to_doc()
    assert doc["overall"]["wasted_per_useful"] is None
    assert read(hist_doc(lookahead=doc)) == none


def _edited(path: str, value):
    doc = copy.deepcopy(LOOK.to_doc())
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize("path, value, message", [
    ("measured_on", KeyError, "`lookahead` must be an object with exactly guesses_per_token, layers, measured_on, "
                              "overall"),
    ("measured_on", " ", "`lookahead.measured_on` must say where the lookahead was measured"),
    ("guesses_per_token", 0, "`lookahead.guesses_per_token` must be an int >= 1, got 0"),
    ("layers.1.layer", 4, "`lookahead.layers` must list one entry per MoE layer after the first, in order (layers "
                          "[2, 3])"),
    ("layers.0.after", 2, "`lookahead.layers[0].after` is 2: the layer read must lie between MoE layer 1 and the "
                          "predicted layer 2"),
    ("layers.0.guesses", 41, "`lookahead.layers[0].guesses` is 41: must be tokens (10, >= 1) x guesses_per_token (4)"),
    ("layers.0.useful", 21, "`lookahead.layers[0].useful` is 21: must be at most guesses and routed"),
    ("layers.0.wasted", 24, "`lookahead.layers[0].useful` is 15: must be at most guesses and routed, with wasted"),
    ("layers.0.recall", 0.7, "`lookahead.layers[0].recall` is 0.7, but the counters give 0.75"),
    ("layers.0.recall", True, "`lookahead.layers[0].recall` is True, but the counters give 0.75"),
    ("layers.0.routed", -1, "`lookahead.layers[0].routed` must be an int >= 0, got -1"),
    ("layers.0.extra", 1, "`lookahead.layers[0]` must have exactly after, guesses, layer, recall, routed, tokens"),
    ("overall.useful", 21, "`lookahead.overall.useful` is 21, but the layers give 20"),
    ("overall.wasted_per_useful", 2.0, "`lookahead.overall.wasted_per_useful` is 2.0, but the counters give 3.0"),
    ("overall.recall", KeyError, "`lookahead.overall` must have exactly guesses, recall, routed, tokens, useful"),
])
def test_a_bad_block_is_refused_naming_the_field(path, value, message):
    with pytest.raises(HistogramError, match=None) as err:
        read(hist_doc(lookahead=_edited(path, value)))
    assert str(err.value).startswith(f"h.json: {message}"), str(err.value)


def test_layers_counting_different_tokens_are_refused():
    doc = _edited("layers.1.tokens", 11)
    doc["layers"][1].update(guesses=44, wasted=39, routed=22, recall=5 / 22)
    with pytest.raises(HistogramError, match="count different tokens per layer"):
        read(hist_doc(lookahead=doc))


def test_plan_refuses_a_bad_block_in_one_line_and_writes_nothing(cli, tiny_hist, tmp_path):
    hist = json.loads(tiny_hist.read_text())  # MoE layers 1..4
    bad = _edited("overall.tokens", 9)
    bad["layers"].append({**bad["layers"][1], "layer": 4, "after": 3})
    tiny_hist.write_text(json.dumps({**hist, "lookahead": bad}))
    out = tmp_path / "plan.json"
    r = cli("plan", tiny_hist, "--recipe", "tiny", "-o", out)
    assert r.code != 0 and len(r.err.strip().splitlines()) == 1
    assert r.err.startswith(f"error: {tiny_hist}: `lookahead.overall.tokens` is 9, but the layers give 10")
    assert not out.exists()
