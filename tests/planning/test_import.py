"""Engine imports: SGLang JSON / recorder dumps and vLLM expert-load tensors -> hotsplit.hist/1."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from hotsplit_runtime.torch_files import load_tensors_only

from hotsplit_cli.cli import main
from hotsplit_cli.core.errors import InputFileError, UsageError
from hotsplit_cli.traffic.hist import load_hist
from hotsplit_cli.traffic.serving_import import read_serving, to_histogram

torch = pytest.importorskip("torch")

DATA = Path(__file__).parents[1] / "data"
TOY = DATA / "sglang-logical-count-toy.json"  # generated: 6 model layers, layer 0 dense, 16 experts, top-2
TOY_ROWS = np.asarray(orjson.loads(TOY.read_bytes())["logical_count"])


@pytest.fixture
def recipe(tmp_path):
    p = tmp_path / "toy.yaml"
    p.write_text("name: toy\nmodel:\n  hidden_size: 64\n  moe_intermediate_size: 32\n  num_hidden_layers: 6\n"
                 "  first_k_dense: 1\n  num_experts: 16\n  top_k: 2\n  total_params: 1.0e7\n")
    return p


def test_sglang_json_with_recipe(recipe, tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["hist", "import", str(TOY), "--from", "sglang", "--recipe", str(recipe), "-o", str(out),
                 "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    h = load_hist(out)
    assert h.layers == (1, 2, 3, 4, 5) and h.top_k == 2 and h.model == "toy"
    np.testing.assert_array_equal(h.counts_LE, TOY_ROWS[1:])
    assert h.tokens == 500
    assert "dropped dense layers [0]" in doc["notes"][0]


def test_sglang_json_without_recipe_drops_zero_rows(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["hist", "import", str(TOY), "--from", "sglang", "--top-k", "2", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "dropped all-zero rows [0]" in captured.out
    assert load_hist(out).layers == (1, 2, 3, 4, 5)


def _logical_count_doc(hist, num_hidden_layers: int) -> dict:
    """SGLang's `{"logical_count": [[...]]}`, one row per model layer (dense rows zero)."""
    out = np.zeros((num_hidden_layers, hist.num_experts))
    out[list(hist.layers)] = hist.counts_LE
    return {"logical_count": out}


def test_json_round_trip_through_logical_count(tmp_path, recipe):
    from hotsplit_cli.config.recipe import load_recipe

    spec = load_recipe(recipe).model
    h = to_histogram(read_serving("sglang", [TOY]), spec).hist
    back = tmp_path / "back.json"
    back.write_bytes(orjson.dumps(_logical_count_doc(h, spec.num_hidden_layers), option=orjson.OPT_SERIALIZE_NUMPY))
    h2 = to_histogram(read_serving("sglang", [back]), spec).hist
    np.testing.assert_array_equal(h.counts_LE, h2.counts_LE)
    assert h.layers == h2.layers and h.tokens == h2.tokens


def test_sglang_stat_dump_pt(tmp_path, recipe):
    rng = np.random.default_rng(0)
    steps = torch.tensor(rng.integers(0, 5, (7, 6, 16)), dtype=torch.int32)
    steps[:, 0] = 0  # dense layer
    p = tmp_path / "expert_distribution_recorder_1.pt"
    torch.save({"rank": 0, "logical_count": steps, "average_utilization_rate_over_window": None}, p)
    from hotsplit_cli.config.recipe import load_recipe

    ec = read_serving("sglang", [p], load_tensors_only)
    assert ec.steps == 7
    h = to_histogram(ec, load_recipe(recipe).model).hist
    np.testing.assert_array_equal(h.counts_LE, steps.sum(0)[1:].numpy())


def test_sglang_per_pass_dumps_of_two_ranks_summed_through_map(tmp_path):
    # 2 layers, 3 logical experts, 4 physical (expert 0 has two replicas)
    p2l = torch.tensor([[0, 1, 2, 0], [0, 1, 2, 0]])
    files = []
    for rank in range(2):
        recs = [{"forward_pass_id": i, "rank": rank, "gatherer_key": "primary",
                 "global_physical_count": torch.tensor([[1, 2, 3, 4], [0, 0, 5, 1]]) * (rank + 1)}
                for i in range(3)]
        f = tmp_path / f"expert_distribution_recorder_1_{rank}.pt"
        torch.save({"records": recs, "last_physical_to_logical_map": p2l}, f)
        files.append(f)
    ec = read_serving("sglang", files, load_tensors_only)
    # per logical expert: [1+4, 2, 3] and [0+1, 0, 5], x3 passes, x(1+2) ranks
    np.testing.assert_array_equal(ec.counts_RE, np.array([[5, 2, 3], [1, 0, 5]]) * 9)
    assert ec.steps == 6 and "per_pass" in ec.form
    h = to_histogram(ec, top_k=1).hist
    assert h.layers == (0, 1) and h.tokens == 90


def test_vllm_window_with_map(tmp_path, recipe):
    load = torch.zeros(3, 5, 18, dtype=torch.int64)  # window 3, 5 MoE layers, 18 physical (2 redundant)
    load[:, :, :16] = 2
    load[:, :, 16:] = 1
    p2l = torch.cat([torch.arange(16), torch.tensor([0, 1])]).expand(5, 18)
    f = tmp_path / "vllm_eplb.pt"
    torch.save({"expert_load_window": load, "physical_to_logical_map": p2l}, f)
    from hotsplit_cli.config.recipe import load_recipe

    imp = to_histogram(read_serving("vllm", [f], load_tensors_only), load_recipe(recipe).model)
    assert imp.hist.layers == (1, 2, 3, 4, 5)
    expected = np.full(16, 6.0)
    expected[:2] += 3
    np.testing.assert_array_equal(imp.hist.counts_LE[0], expected)
    assert "MoE layers" in imp.notes[0]


def test_vllm_json_refused_with_explanation(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["hist", "import", str(TOY), "--from", "vllm", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "vLLM writes no expert-load file" in err and "torch.save" in err
    assert not out.exists()


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickled_objects_refused(tmp_path, capsys):
    f = tmp_path / "evil.pt"
    torch.save({"logical_count": [[1, 2]], "x": Evil()}, f)
    out = tmp_path / "h.json"
    assert main(["hist", "import", str(f), "--from", "sglang", "--top-k", "1", "-o", str(out)]) == 1
    captured = capsys.readouterr()
    assert "weights_only=True" in captured.err and "pwned" not in captured.out
    assert not out.exists()


@pytest.mark.parametrize("content,msg", [
    ('{"logical_count": [[1, 2], [3]]}', "not a numeric array"),
    ('{"logical_count": [[1, -2]]}', "negative"),
    ('{"logical_count": [[0, 0]]}', "every count is zero"),
    ('{"other": 1}', "no `logical_count`"),
    ('{"logical_count": [[1, 2]', "not valid JSON"),
])
def test_bad_json_refused_nothing_written(tmp_path, capsys, content, msg):
    f = tmp_path / "x.json"
    f.write_text(content)
    out = tmp_path / "h.json"
    assert main(["hist", "import", str(f), "--from", "sglang", "--top-k", "1", "-o", str(out)]) == 1
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_wrong_recipe_refused(tmp_path, recipe):
    rows = TOY_ROWS.copy()
    rows[0, 3] = 1  # a count on the layer the recipe calls dense
    f = tmp_path / "x.json"
    f.write_text(orjson.dumps({"logical_count": rows.tolist()}).decode())
    from hotsplit_cli.config.recipe import load_recipe

    with pytest.raises(InputFileError, match="dense"):
        to_histogram(read_serving("sglang", [f]), load_recipe(recipe).model)
    with pytest.raises(InputFileError, match="rows"):
        to_histogram(read_serving("sglang", [f]).__class__(rows[:4], "model layers", "x", None),
                     load_recipe(recipe).model)


def test_usage_errors(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["hist", "import", str(TOY), "--from", "trt", "-o", str(out)]) == 2
    assert main(["hist", "import", str(TOY), "--from", "sglang"]) == 2
    with pytest.raises(UsageError, match="top_k"):
        to_histogram(read_serving("sglang", [TOY]))
    assert main(["hist", "import", str(tmp_path / "missing.json"), "--from", "sglang", "--top-k", "2",
                 "-o", str(out)]) == 1
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("1,2")
    assert main(["hist", "import", str(tmp_path / "x.csv"), "--from", "sglang", "--top-k", "2", "-o", str(out)]) == 1
    assert not out.exists()
