import pytest

from hotsplit_cli.config.knobs import KNOBS, resolve_knobs
from hotsplit_cli.core.errors import UsageError


def test_defaults():
    k = resolve_knobs({}, {}, {})
    assert (k.hot_gib, k.dynamic, k.dyn_steps, k.dyn_max_swaps, k.dyn_margin, k.vram_reserve_gib, k.numa_policy,
            k.cold_path, k.dyn_decay) == (None, True, 2000, 2, 1.25, 2.0, "preferred", "gpu", 0.8)
    assert set(k.sources.values()) == {"default"}


def test_precedence_flag_over_env_over_recipe_over_default():
    recipe = {"dyn_steps": 10, "dyn_margin": 1.5, "hot_gib": 3}
    env = {"HOTSPLIT_DYN_STEPS": "20", "HOTSPLIT_HOT_GIB": "4"}
    k = resolve_knobs(recipe, env, {"hot_gib": "5"})
    assert (k.hot_gib, k.dyn_steps, k.dyn_margin, k.dyn_max_swaps) == (5.0, 20, 1.5, 2)
    assert k.sources == {**k.sources, "hot_gib": "flag", "dyn_steps": "env", "dyn_margin": "recipe",
                         "dyn_max_swaps": "default"}


def test_empty_hot_gib_means_auto():
    assert resolve_knobs({}, {"HOTSPLIT_HOT_GIB": ""}, {}).hot_gib is None


BAD = [
    ("hot_gib", "-1", ">= 0"), ("hot_gib", "lots", "finite number"), ("hot_gib", "nan", "finite number"),
    ("dynamic", "2", "0 or 1"), ("dynamic", "yes please", "0 or 1"),
    ("dyn_steps", "0", ">= 1"), ("dyn_steps", "1.5", "integer"), ("dyn_steps", "", "must be set"),
    ("dyn_max_swaps", "-1", ">= 0"), ("dyn_margin", "0.9", ">= 1"), ("dyn_margin", "inf", "finite"),
    ("vram_reserve_gib", "-0.5", ">= 0"), ("numa_policy", "everywhere", "preferred, bind, off"),
    ("cold_path", "gpus", "gpu, cpu, split"), ("cold_path", "", "must be set"),
    ("dyn_decay", "1.5", "<= 1"), ("dyn_decay", "-0.1", ">= 0"), ("dyn_decay", "nan", "finite"),
    ("dyn_rule", "lfu", "must be one of credit, breakeven, got 'lfu'"), ("dyn_rule", "", "must be set"),
    ("dyn_sigmas", "-1", ">= 0"), ("dyn_sigmas", "inf", "finite"),
    ("precision", "int4", "must be one of native, fp8, mxfp4, auto, got 'int4'"), ("precision", "", "must be set"),
    ("prefetch", "router", "must be one of off, lookahead, trace, auto, got 'router'"), ("prefetch", "", "must be set"),
    ("prefetch_slots", "-1", ">= 0"), ("prefetch_slots", "2.5", "integer"),
    ("prefetch_pool", "ring", "must be one of layer, shared"), ("prefetch_guesses", "0", ">= 1"),
]


def test_dyn_decay_precedence_and_range_ends():
    k = resolve_knobs({"dyn_decay": 0.5}, {"HOTSPLIT_DYN_DECAY": "0"}, {})
    assert (k.dyn_decay, k.sources["dyn_decay"]) == (0.0, "env")
    assert resolve_knobs({"dyn_decay": 0.5}, {"HOTSPLIT_DYN_DECAY": "0"}, {"dyn_decay": "1"}).dyn_decay == 1.0
    assert resolve_knobs({"dyn_decay": 0.5}, {}, {}).dyn_decay == 0.5


def test_dyn_rule_and_sigmas_precedence_and_defaults():
    k = resolve_knobs({}, {}, {})
    assert (k.dyn_rule, k.dyn_sigmas) == ("credit", 2.0)
    k = resolve_knobs({"dyn_rule": "credit", "dyn_sigmas": 1}, {"HOTSPLIT_DYN_RULE": "breakeven"}, {"dyn_sigmas": "3"})
    assert (k.dyn_rule, k.sources["dyn_rule"]) == ("breakeven", "env")
    assert (k.dyn_sigmas, k.sources["dyn_sigmas"]) == (3.0, "flag")


def test_prefetch_knobs_precedence_and_defaults():
    k = resolve_knobs({}, {}, {})
    assert (k.prefetch, k.prefetch_slots, k.prefetch_pool, k.prefetch_guesses) == ("off", 4, "shared", 12)
    k = resolve_knobs({"prefetch": "lookahead", "prefetch_slots": 1}, {"HOTSPLIT_PREFETCH": "trace"},
                      {"prefetch_slots": "2", "prefetch_guesses": "24"})
    assert (k.prefetch, k.sources["prefetch"]) == ("trace", "env")
    assert (k.prefetch_slots, k.prefetch_guesses, k.sources["prefetch_slots"]) == (2, 24, "flag")


def test_cold_path_precedence():
    k = resolve_knobs({"cold_path": "cpu"}, {"HOTSPLIT_COLD_PATH": "split"}, {})
    assert (k.cold_path, k.sources["cold_path"]) == ("split", "env")
    assert resolve_knobs({"cold_path": "cpu"}, {"HOTSPLIT_COLD_PATH": "split"}, {"cold_path": "gpu"}).cold_path == "gpu"
    assert resolve_knobs({"cold_path": "cpu"}, {}, {}).cold_path == "cpu"


def test_precision_precedence_and_default():
    default = resolve_knobs({}, {}, {})
    assert (default.precision, default.sources["precision"]) == ("native", "default")
    env = {"HOTSPLIT_PRECISION": "mxfp4"}
    k = resolve_knobs({"precision": "fp8"}, env, {})
    assert (k.precision, k.sources["precision"]) == ("mxfp4", "env")
    assert resolve_knobs({"precision": "fp8"}, env, {"precision": "native"}).precision == "native"
    assert resolve_knobs({"precision": "fp8"}, {}, {}).precision == "fp8"


@pytest.mark.parametrize("name, value, message", BAD)
def test_every_bad_value_is_refused_from_every_source(name, value, message):
    spec = next(k for k in KNOBS if k.name == name)
    with pytest.raises(UsageError, match=message) as exc:
        resolve_knobs({}, {spec.env: value}, {})
    assert spec.env in str(exc.value) and exc.value.exit_code == 2
    with pytest.raises(UsageError, match=f"hotsplit.{name}"):
        resolve_knobs({name: value}, {}, {})
    with pytest.raises(UsageError, match=f"--{name.replace('_', '-')}"):
        resolve_knobs({}, {}, {name: value})


def test_recipe_yaml_types_are_checked():
    with pytest.raises(UsageError, match="hotsplit.dyn_steps: must be >= 1, got 0"):
        resolve_knobs({"dyn_steps": 0}, {}, {})
    with pytest.raises(UsageError, match="hotsplit.dyn_steps: must be an integer"):
        resolve_knobs({"dyn_steps": 2.5}, {}, {})
    assert resolve_knobs({"dynamic": 0}, {}, {}).dynamic is False
