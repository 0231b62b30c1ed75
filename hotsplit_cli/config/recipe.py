"""Recipes: one YAML file describes one deployment. Loaded and validated here, and only here.

Every key is checked: an unknown key, a missing key or an out-of-range value raises
`RecipeError` naming the key's path (`hotsplit.dyn_steps: must be >= 1, got 0`).
Paths inside a recipe (checkpoint, traffic files) are relative to the recipe's folder.
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hotsplit_cli.config.checkpoint import check_against_checkpoint
from hotsplit_cli.config.knobs import KNOB_NAMES, resolve_knobs
from hotsplit_cli.core.errors import RecipeError

GIB = 1 << 30
EXPERT_DTYPES = ("bf16", "fp16", "fp32", "fp8", "mxfp4")
ROUTERS = ("softmax", "sigmoid")
TRAFFIC_KINDS = ("synthetic", "histogram", "trace", "prompts")
MODEL_KINDS = ("synthetic", "hf")
RECIPES_DIR = Path(__file__).resolve().parent / "recipes"  # package data; the checkout links recipes/ here

_REQUIRED = object()


@dataclass(frozen=True)
class ModelSpec:
    """True geometry of the model (never scaled: plans use these sizes)."""

    name: str
    kind: str  # synthetic | hf
    path: Path | None  # local checkpoint folder when kind == "hf"
    family: str  # e.g. deepseek_v3, qwen3_moe, mixtral
    hidden_size: int
    moe_intermediate_size: int  # per routed expert
    num_hidden_layers: int
    moe_layer_ids: tuple[int, ...]  # model layer index of each MoE layer
    num_experts: int  # routed experts per MoE layer
    top_k: int
    num_shared_experts: int
    shared_intermediate_size: int  # total across shared experts
    router: str  # softmax | sigmoid (DeepSeek-V3 style with score bias)
    norm_topk_prob: bool
    n_group: int  # group-limited routing (1 = off)
    topk_group: int
    routed_scaling_factor: float
    expert_dtype: str  # bf16 | fp16 | fp32 | fp8 (128x128 block scales) | mxfp4 (e8m0 scale per 32)
    expert_bias: bool  # gpt-oss experts carry biases
    dense_dtype_bytes: int
    total_params: float  # whole model, from the model card / config (parameters)
    active_params: float | None
    dense_bytes: float | None = None  # whole model's non-expert weight bytes, when dtypes are mixed

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layer_ids)

    @property
    def routed_expert_params(self) -> int:
        """Parameters of every routed expert of every MoE layer (SwiGLU: gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size * self.num_experts * self.num_moe_layers

    @property
    def dense_params(self) -> float:
        """Everything that is not a routed expert: attention, embeddings, dense and shared MLPs."""
        return max(0.0, self.total_params - self.routed_expert_params)

    @property
    def dense_weight_bytes(self) -> float:
        """Bytes of everything that is not a routed expert (whole model): `dense_bytes` when the
        recipe gives it (mixed dtypes, e.g. fp8 linears with bf16 embeddings), else
        dense_params x dense_dtype_bytes."""
        return self.dense_bytes if self.dense_bytes is not None else self.dense_params * self.dense_dtype_bytes


@dataclass(frozen=True)
class ParallelSpec:
    tp: int = 1
    ep: int = 1

    @property
    def ranks(self) -> int:
        return self.tp * self.ep


@dataclass(frozen=True)
class HardwareSpec:
    gpu: str = "unknown"
    gpu_mem_gib: float | None = None  # per GPU; None = unknown (probe it)
    kv_cache_gib: float = 0.0  # per rank, reserved for the KV cache
    pcie_gbps: float | None = None  # zero-copy read rate if known (GB/s, 1e9 B/s)
    host_mem_gib: float | None = None  # per node, what the cold banks may pin from; None = unknown


@dataclass(frozen=True)
class TrafficSpec:
    kind: str = "synthetic"
    path: Path | None = None
    batch: int = 8  # tokens per engine step
    skew: float = 1.0  # Zipf exponent of the synthetic expert popularity
    drift_every: int = 0  # steps between hotspot moves (0 = no drift)
    seed: int = 0
    max_new_tokens: int = 32


@dataclass(frozen=True)
class RunSpec:
    steps: int = 200
    scale: float = 1.0  # shrinks the tensors a CPU run allocates; never the planning sizes
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0


@dataclass(frozen=True)
class Recipe:
    name: str
    path: Path | None
    model: ModelSpec
    parallel: ParallelSpec
    hardware: HardwareSpec
    traffic: TrafficSpec
    run: RunSpec
    knobs: dict[str, Any] = field(default_factory=dict)  # raw `hotsplit:` section, see knobs.py


class _Section:
    """Takes keys out of one mapping, checking each; whatever is left over is unknown."""

    def __init__(self, data: Any, path: str):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RecipeError(f"{path}: must be a mapping, got {type(data).__name__}")
        self.data = dict(data)
        self.path = path

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def take(self, name: str, kind: type | tuple, default: Any = _REQUIRED, *, minimum=None,
             maximum=None, choices=None) -> Any:
        if name not in self.data:
            if default is _REQUIRED:
                near = difflib.get_close_matches(name, [str(k) for k in self.data], n=1, cutoff=0.6)
                if near:  # a misspelt key: say so rather than call the intended one missing
                    raise RecipeError(f"{self.key(near[0])}: unknown key (did you mean {self.key(name)}?)",
                                      "docs/recipes.md lists every key")
                raise RecipeError(f"{self.key(name)}: missing", "docs/recipes.md lists every key")
            return default
        value = self.data.pop(name)
        if value is None and default is None:
            return None
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if float in kinds and isinstance(value, str):
            try:  # YAML 1.1 reads `671e9` (no sign in the exponent) as a string
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) and bool not in kinds:
            raise RecipeError(f"{self.key(name)}: must be {_kind_name(kinds)}, got {value!r}")
        if not isinstance(value, kinds):
            raise RecipeError(f"{self.key(name)}: must be {_kind_name(kinds)}, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise RecipeError(f"{self.key(name)}: must be finite, got {value!r}")
        if minimum is not None and value < minimum:
            raise RecipeError(f"{self.key(name)}: must be >= {minimum}, got {value!r}")
        if maximum is not None and value > maximum:
            raise RecipeError(f"{self.key(name)}: must be <= {maximum}, got {value!r}")
        if choices is not None and value not in choices:
            raise RecipeError(f"{self.key(name)}: must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value

    def section(self, name: str) -> _Section:
        return _Section(self.data.pop(name, None), self.key(name))

    def done(self) -> None:
        if self.data:
            unknown = sorted(map(str, self.data))[0]
            raise RecipeError(f"{self.key(unknown)}: unknown key", "docs/recipes.md lists every key")


def _kind_name(kinds: tuple) -> str:
    names = {int: "an int", float: "a number", str: "a string", bool: "true/false", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def recipe_file(recipe: Recipe) -> str | None:
    """The absolute path a recipe that is not shipped was read from, which a plan or placement made
    with it records so that `export` finds it again; None for a shipped recipe (its name finds it)."""
    if recipe.path is None or recipe.path.resolve().parent == RECIPES_DIR.resolve():
        return None
    return str(recipe.path.resolve())


def resolve_recipe_path(name_or_path: str | os.PathLike) -> Path:
    """A path to a YAML file, or the name of a shipped recipe (`tiny`, `deepseek-v3`)."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    for cand in (RECIPES_DIR / f"{name_or_path}.yaml", RECIPES_DIR / str(name_or_path)):
        if cand.is_file():
            return cand
    shipped = ", ".join(sorted(x.stem for x in RECIPES_DIR.glob("*.yaml"))) or "none"
    if p.is_dir():
        raise RecipeError(f"recipe {str(name_or_path)!r}: is a folder, not a recipe YAML file",
                          f"name a recipe file or a shipped recipe ({shipped}); a checkpoint folder goes in "
                          "a recipe's model.path")
    raise RecipeError(f"recipe {str(name_or_path)!r}: no such file", f"shipped recipes: {shipped}")


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, 10x faster, where PyYAML has it


def load_recipe(name_or_path: str | os.PathLike) -> Recipe:
    path = resolve_recipe_path(name_or_path)
    try:
        data = yaml.load(path.read_text(), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise RecipeError(f"{path}: not valid YAML: {_yaml_problem(exc)}", "fix the recipe's YAML syntax") from None
    return parse_recipe(data, path)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's problem and where it is, on one line (`line 2, column 6: expected ...`)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(problem.split())


def parse_recipe(data: Any, path: Path | None = None) -> Recipe:
    root = _Section(data, "")
    base = path.parent if path else Path(".")
    name = root.take("name", str, path.stem if path else "recipe")
    model = _parse_model(root.section("model"), base, name)
    par = root.section("parallel")
    parallel = ParallelSpec(tp=par.take("tp", int, 1, minimum=1), ep=par.take("ep", int, 1, minimum=1))
    par.done()
    if model.num_experts % parallel.ep:
        raise RecipeError(
            f"parallel.ep: {parallel.ep} does not divide model.num_experts ({model.num_experts})"
        )
    if model.moe_intermediate_size % parallel.tp:
        raise RecipeError(
            f"parallel.tp: {parallel.tp} does not divide model.moe_intermediate_size "
            f"({model.moe_intermediate_size})"
        )
    hw = root.section("hardware")
    hardware = HardwareSpec(
        gpu=hw.take("gpu", str, "unknown"),
        gpu_mem_gib=hw.take("gpu_mem_gib", float, None, minimum=0.0),
        kv_cache_gib=hw.take("kv_cache_gib", float, 0.0, minimum=0.0),
        pcie_gbps=hw.take("pcie_gbps", float, None, minimum=0.0),
        host_mem_gib=hw.take("host_mem_gib", float, None, minimum=0.0),
    )
    hw.done()
    traffic = _parse_traffic(root.section("traffic"), base)
    rs = root.section("run")
    run = RunSpec(
        steps=rs.take("steps", int, 200, minimum=1),
        scale=rs.take("scale", float, 1.0, minimum=1e-6, maximum=1.0),
        device=rs.take("device", str, "auto"),
        seed=rs.take("seed", int, 0, minimum=0),
    )
    rs.done()
    knobs_raw = _knobs_of(root)
    return Recipe(name, path, model, parallel, hardware, traffic, run, dict(knobs_raw))


def _parse_traffic(tr: _Section, base: Path) -> TrafficSpec:
    kind = tr.take("kind", str, "synthetic", choices=TRAFFIC_KINDS)
    tpath = tr.take("path", str, None)
    if kind != "synthetic" and tpath is None:
        raise RecipeError(f"traffic.path: missing (traffic.kind is {kind})")
    spec = TrafficSpec(
        kind=kind,
        path=(base / tpath) if tpath else None,
        batch=tr.take("batch", int, 8, minimum=1),
        skew=tr.take("skew", float, 1.0, minimum=0.0),
        drift_every=tr.take("drift_every", int, 0, minimum=0),
        seed=tr.take("seed", int, 0, minimum=0),
        max_new_tokens=tr.take("max_new_tokens", int, 32, minimum=0),
    )
    tr.done()
    return spec


def _knobs_of(root: _Section) -> dict:
    """The recipe's `hotsplit:` knobs, names and ranges checked (the rest of the root is done)."""
    knobs_raw = root.data.pop("hotsplit", None) or {}
    if not isinstance(knobs_raw, dict):
        raise RecipeError("hotsplit: must be a mapping")
    root.done()
    # Knob values are validated in knobs.resolve_knobs (with env and flags); unknown names here.
    for k in knobs_raw:
        if k not in KNOB_NAMES:
            raise RecipeError(f"hotsplit.{k}: unknown key", f"knobs are: {', '.join(KNOB_NAMES)}")
    # Range-check the values now, so a bad recipe is refused when it is loaded.
    resolve_knobs(knobs_raw, env={}, flags={})
    return knobs_raw


def _moe_layer_ids(m: _Section, layers: int) -> tuple[int, ...]:
    """The MoE layers: listed (`moe_layers`), or every `moe_every`-th after `first_k_dense`."""
    explicit = m.take("moe_layers", list, None)
    first_dense = m.take("first_k_dense", int, 0, minimum=0)
    every = m.take("moe_every", int, 1, minimum=1)
    if explicit is not None:
        for i, x in enumerate(explicit):
            if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < layers:
                raise RecipeError(f"model.moe_layers[{i}]: must be a layer index in [0, {layers}), got {x!r}")
        if len(set(explicit)) != len(explicit) or list(explicit) != sorted(explicit):
            raise RecipeError("model.moe_layers: must be strictly increasing")
        moe_ids = tuple(explicit)
    else:
        moe_ids = tuple(i for i in range(first_dense, layers) if (i - first_dense) % every == 0)
    if not moe_ids:
        raise RecipeError("model.first_k_dense: leaves no MoE layer")
    return moe_ids


def _parse_model(m: _Section, base: Path, recipe_name: str) -> ModelSpec:
    kind = m.take("kind", str, "synthetic", choices=MODEL_KINDS)
    mpath = m.take("path", str, None)
    if kind == "hf" and mpath is None:
        raise RecipeError("model.path: missing (model.kind is hf: name the checkpoint folder)")
    layers = m.take("num_hidden_layers", int, minimum=1)
    moe_ids = _moe_layer_ids(m, layers)
    hidden = m.take("hidden_size", int, minimum=1)
    inter = m.take("moe_intermediate_size", int, minimum=1)
    experts = m.take("num_experts", int, minimum=1)
    top_k = m.take("top_k", int, minimum=1, maximum=experts)
    shared = m.take("num_shared_experts", int, 0, minimum=0)
    shared_inter = m.take("shared_intermediate_size", int, inter * shared, minimum=0)
    router = m.take("router", str, "softmax", choices=ROUTERS)
    n_group = m.take("n_group", int, 1, minimum=1)
    topk_group = m.take("topk_group", int, n_group, minimum=1, maximum=n_group)
    if experts % n_group:
        raise RecipeError(f"model.n_group: {n_group} does not divide model.num_experts ({experts})")
    if "dense_bytes" in m.data and "dense_dtype_bytes" in m.data:
        raise RecipeError("model.dense_bytes: give it or model.dense_dtype_bytes, not both",
                          "dense_bytes is the total for mixed dtypes; dense_dtype_bytes multiplies the parameters")
    spec = ModelSpec(
        name=m.take("name", str, recipe_name),
        kind=kind,
        path=(base / mpath) if mpath else None,
        family=m.take("family", str, "synthetic"),
        hidden_size=hidden,
        moe_intermediate_size=inter,
        num_hidden_layers=layers,
        moe_layer_ids=moe_ids,
        num_experts=experts,
        top_k=top_k,
        num_shared_experts=shared,
        shared_intermediate_size=shared_inter,
        router=router,
        norm_topk_prob=m.take("norm_topk_prob", bool, True),
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=m.take("routed_scaling_factor", float, 1.0, minimum=0.0),
        expert_dtype=m.take("expert_dtype", str, "bf16", choices=EXPERT_DTYPES),
        expert_bias=m.take("expert_bias", bool, False),
        dense_dtype_bytes=m.take("dense_dtype_bytes", int, 2, minimum=1, maximum=8),
        total_params=m.take("total_params", float, minimum=0.0),
        active_params=m.take("active_params", float, None, minimum=0.0),
        dense_bytes=m.take("dense_bytes", float, None, minimum=0.0),
    )
    m.done()
    if kind == "hf":  # before anything else reads the recipe: the checkpoint's config.json is the truth
        check_against_checkpoint(spec)
    if spec.total_params and spec.total_params < spec.routed_expert_params:
        raise RecipeError(
            f"model.total_params: {spec.total_params:.4g} is below the routed experts alone "
            f"({spec.routed_expert_params:.4g}); check the geometry"
        )
    return spec
