"""A Hugging Face checkpoint's geometry, read from its `config.json` alone (JSON, no torch):
what `hotsplit recipe` writes and what every checkpoint recipe is checked against.

Each family names its keys differently (transformers' configuration_*.py and the hub configs):
  experts  num_experts (qwen, olmoe) | num_local_experts (mixtral, gpt-oss) | n_routed_experts (deepseek, glm, mimo)
  expert intermediate  moe_intermediate_size | intermediate_size (mixtral, olmoe, gpt-oss)
  MoE layers  decoder_sparse_step + mlp_only_layers (qwen) | first_k_dense_replace (deepseek, glm)
              | mlp_layer_types or moe_layer_freq (mimo) | every layer (mixtral, olmoe, gpt-oss)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotsplit_cli.core.errors import InputFileError, RecipeError, UsageError
from hotsplit_cli.core.jsonio import read_json

# model_type values whose experts the runtime's loader has been checked against (tests/test_hf_*.py).
CHECKPOINT_FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v3", "glm4_moe", "mimo_v2_flash",
                       "gpt_oss")
_SIGMOID_ROUTED = ("deepseek_v3", "glm4_moe", "mimo_v2_flash")  # sigmoid scores, score bias, groups
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
# The config.json keys each recipe field is read from, first present wins.
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token")
_WHOLE_MLP_EXPERTS = ("mixtral", "olmoe", "gpt_oss")  # their expert size is intermediate_size
# How each family says which layers are MoE (the rule of its transformers model).
MOE_LAYER_RULES = {"qwen3_moe": "decoder_sparse_step, mlp_only_layers", "qwen2_moe": "decoder_sparse_step, "
                   "mlp_only_layers", "deepseek_v3": "first_k_dense_replace", "glm4_moe": "first_k_dense_replace",
                   "mimo_v2_flash": "mlp_layer_types or moe_layer_freq", "mixtral": "every layer",
                   "olmoe": "every layer", "gpt_oss": "every layer"}


@dataclass(frozen=True)
class CheckpointGeometry:
    """The recipe's `model:` fields of a checkpoint, as its config.json gives them."""

    family: str
    hidden_size: int
    moe_intermediate_size: int  # per routed expert
    num_hidden_layers: int
    moe_layer_ids: tuple[int, ...]
    num_experts: int
    top_k: int
    num_shared_experts: int
    shared_intermediate_size: int  # all shared experts together
    router: str
    norm_topk_prob: bool
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    expert_dtype: str  # bf16 | fp16 | fp32 | fp8 | mxfp4
    expert_bias: bool
    dense_dtype_bytes: int  # the dtype the non-expert weights run in (fp8 ones are dequantised to it)


def config_path_of(model: str | Path) -> Path:
    """`config.json` of a checkpoint folder, or the file itself when `model` names it."""
    path = Path(model)
    config = path if path.name == "config.json" or path.is_file() else path / "config.json"
    if not path.exists():
        raise InputFileError(f"{path}: no such folder or file", "point at a checkpoint folder or its config.json")
    if not config.is_file():
        raise InputFileError(f"{path}: no config.json", "point at a Hugging Face checkpoint folder")
    return config


def read_checkpoint_config(model: str | Path) -> dict:
    """The checkpoint's config.json as a dict, its family checked (UsageError naming the
    supported families)."""
    config_file = config_path_of(model)
    config = read_json(config_file)
    if not isinstance(config, dict):
        raise InputFileError(f"{config_file}: must be a JSON object")
    family = config.get("model_type")
    if family not in CHECKPOINT_FAMILIES:
        raise UsageError(f"{config_file}: model_type {family!r} is not supported",
                         f"supported: {', '.join(CHECKPOINT_FAMILIES)}")
    return config


def _first(config: dict, where: str, *keys: str, default: Any = None) -> Any:
    """The value of the first of `keys` config.json has (None counts as absent); `default`, else
    an InputFileError naming the keys."""
    for k in keys:
        if config.get(k) is not None:
            return config[k]
    if default is None:
        raise InputFileError(f"{where}: config.json has none of {', '.join(keys)}")
    return default


def expert_size_key(family: str) -> str:
    """The config.json key of one routed expert's intermediate size."""
    return "intermediate_size" if family in _WHOLE_MLP_EXPERTS else "moe_intermediate_size"


def key_used(config: dict, keys: tuple[str, ...]) -> str:
    """Which of `keys` config.json gives (the first present), for saying where a value came from."""
    return next((k for k in keys if config.get(k) is not None), keys[0])


def _moe_layer_ids(config: dict, family: str, layers: int) -> tuple[int, ...]:
    """Model layer index of each MoE layer, by the rule transformers' model of `family` builds."""
    if family in ("qwen3_moe", "qwen2_moe"):
        step, dense = config.get("decoder_sparse_step") or 1, set(config.get("mlp_only_layers") or [])
        return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if family in ("deepseek_v3", "glm4_moe"):
        first = config.get("first_k_dense_replace") or 0
        return tuple(range(first, layers))
    if family == "mimo_v2_flash":
        kinds = config.get("mlp_layer_types")
        if kinds is None:  # the hub file: moe_layer_freq [0, 1, 1, ...]; transformers' default: layer 0 dense
            freq = config.get("moe_layer_freq")
            kinds = ["sparse" if f else "dense" for f in freq] if isinstance(freq, list) else \
                ["dense"] + ["sparse"] * (layers - 1)
        return tuple(i for i, k in enumerate(kinds[:layers]) if k == "sparse")
    return tuple(range(layers))  # mixtral, olmoe, gpt_oss: every layer


def quant_method(config: dict) -> str | None:
    """`quantization_config.quant_method` (fp8, mxfp4, gptq, ...), None when not quantised."""
    q = config.get("quantization_config")
    return str(q.get("quant_method", "?")) if isinstance(q, dict) else None


def stored_experts_of(quantization: dict | None, where: str) -> tuple[str, tuple[int, int] | None]:
    """How a checkpoint's `quantization_config` stores its routed experts: ("native", None),
    ("mxfp4", None) (gpt-oss's releases) or ("fp8", its `weight_block_size`, None for one scale
    per tensor); UsageError naming any other quantisation (GPTQ, AWQ, bitsandbytes, static
    activation scales)."""
    if not quantization:
        return "native", None
    method = quantization.get("quant_method", "?")
    if method == "mxfp4":
        return "mxfp4", None
    if method != "fp8":
        raise UsageError(f"{where}: quantised checkpoint ({method}) is not supported",
                         "use a bf16, block-scaled fp8 or mxfp4 checkpoint")
    fmt = quantization.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise UsageError(f"{where}: fp8 format {fmt!r} is not supported", "only e4m3 weights are read")
    if quantization.get("activation_scheme", "dynamic") != "dynamic":
        raise UsageError(f"{where}: fp8 with static activation scales is not supported")
    block = quantization.get("weight_block_size")
    if block is not None and (len(block) != 2 or not all(isinstance(b, int) and b > 0 for b in block)):
        raise UsageError(f"{where}: weight_block_size must be two positive ints, got {block!r}")
    return "fp8", None if block is None else (int(block[0]), int(block[1]))


def expert_dtype_of(config: dict, where: str) -> str:
    """How the routed experts are stored: the quantisation when there is one, else the dtype."""
    method = quant_method(config)
    if method in ("fp8", "mxfp4"):
        return method
    if method is not None:
        raise UsageError(f"{where}: quantised checkpoint ({method}) is not supported",
                         "use a bf16, fp16, fp32, block-scaled fp8 or mxfp4 checkpoint")
    return _torch_dtype(config, where)


def _torch_dtype(config: dict, where: str) -> str:
    name = str(config.get("dtype") or config.get("torch_dtype") or "float32")  # transformers' own default
    if name not in _TORCH_DTYPES:
        raise UsageError(f"{where}: dtype {name!r} is not supported", f"supported: {', '.join(_TORCH_DTYPES)}")
    return _TORCH_DTYPES[name]


def geometry_of(config: dict, where: str) -> CheckpointGeometry:
    """The geometry of a config.json read by read_checkpoint_config (`where` names it in errors)."""
    family = config["model_type"]
    layers = int(_first(config, where, "num_hidden_layers"))
    experts = int(_first(config, where, *EXPERT_KEYS))
    inter = int(_first(config, where, expert_size_key(family)))
    shared, shared_inter = _shared_experts(config, family, inter)
    sigmoid = family in _SIGMOID_ROUTED
    n_group = int(config.get("n_group") or 1) if sigmoid else 1
    return CheckpointGeometry(
        family=family, hidden_size=int(_first(config, where, "hidden_size")), moe_intermediate_size=inter,
        num_hidden_layers=layers, moe_layer_ids=_moe_layer_ids(config, family, layers), num_experts=experts,
        top_k=int(_first(config, where, *TOP_K_KEYS)),
        num_shared_experts=shared, shared_intermediate_size=shared_inter,
        router="sigmoid" if sigmoid else "softmax",
        # qwen and olmoe leave top-k weights unnormalised by default; mixtral and gpt-oss renormalise
        norm_topk_prob=bool(config.get("norm_topk_prob", family not in ("qwen3_moe", "qwen2_moe", "olmoe"))),
        n_group=n_group, topk_group=int(config.get("topk_group") or n_group) if sigmoid else 1,
        routed_scaling_factor=float(config.get("routed_scaling_factor") or 1.0),
        expert_dtype=expert_dtype_of(config, where), expert_bias=family == "gpt_oss",
        dense_dtype_bytes=DTYPE_BYTES[_torch_dtype(config, where)])


def _shared_experts(config: dict, family: str, inter: int) -> tuple[int, int]:
    """(shared experts, their intermediate size together)."""
    if family == "qwen2_moe":  # one shared expert of its own size
        size = int(config.get("shared_expert_intermediate_size") or 0)
        return (1 if size else 0), size
    n = int(config.get("n_shared_experts") or 0)
    return n, n * inter


def read_geometry(model: str | Path) -> CheckpointGeometry:
    """The geometry of the checkpoint at `model` (a folder or its config.json)."""
    return geometry_of(read_checkpoint_config(model), str(config_path_of(model)))


# The recipe's fields checked against config.json, in the order a mismatch is reported.
CHECKED_FIELDS = (("family", "family"), ("hidden_size", "hidden_size"),
                  ("moe_intermediate_size", "moe_intermediate_size"), ("num_hidden_layers", "num_hidden_layers"),
                  ("moe_layers", "moe_layer_ids"), ("num_experts", "num_experts"), ("top_k", "top_k"),
                  ("num_shared_experts", "num_shared_experts"), ("expert_dtype", "expert_dtype"))


def check_against_checkpoint(spec) -> None:
    """Refuse a recipe's `model:` (a recipe.ModelSpec, which imports this module) when it is
    not its config.json's. Refuse a checkpoint recipe whose geometry is not its config.json's: one line naming the
    first field that differs and both values. Reads config.json only: nothing is loaded."""
    if spec.path is None or not (spec.path / "config.json").is_file():
        raise RecipeError(f"model.path: {spec.path} has no config.json",
                          "name the checkpoint folder (`hotsplit recipe --model DIR` writes a recipe for it)")
    ckpt = read_geometry(spec.path)
    for key, attr in CHECKED_FIELDS:
        mine, theirs = getattr(spec, attr), getattr(ckpt, attr)
        if mine != theirs:
            show = (lambda v: list(v)) if key == "moe_layers" else (lambda v: v)
            raise RecipeError(f"model.{key}: the recipe says {show(mine)!r}, the checkpoint's config.json says "
                              f"{show(theirs)!r} ({spec.path / 'config.json'})",
                              f"fix the recipe, or write it with `hotsplit recipe --model {spec.path}`")
