"""`hotsplit recipe`: a complete recipe written from a checkpoint folder (or its config.json
alone), every field followed by a comment saying where it came from."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from hotsplit_cli.config.checkpoint import (
    EXPERT_KEYS,
    MOE_LAYER_RULES,
    TOP_K_KEYS,
    CheckpointGeometry,
    config_path_of,
    expert_size_key,
    geometry_of,
    key_used,
    quant_method,
    read_checkpoint_config,
)
from hotsplit_cli.config.checkpoint_params import ParamCount, count_params
from hotsplit_cli.config.platform_file import load_platform
from hotsplit_cli.config.recipe import GIB, Recipe, parse_recipe
from hotsplit_cli.core.errors import UsageError


@dataclass(frozen=True)
class HardwareChoice:
    """The GPU (and host) a recipe is written for, and where each figure came from."""

    gpu: str
    gpu_mem_gib: float | None  # None: unknown (plan then needs --hot-gib)
    gpu_source: str
    host_mem_gib: float | None = None
    host_source: str = ""


@dataclass(frozen=True)
class WrittenRecipe:
    """A recipe's YAML text, the recipe it parses to, and where its figures came from."""

    text: str
    recipe: Recipe
    geometry: CheckpointGeometry
    params: ParamCount


def hardware_of(gpu_mem_gib: float | None, platform_path: Path | None) -> HardwareChoice:
    """--gpu-mem-gib when given, else the probe's GPU 0 (total memory) and host memory."""
    if platform_path is None and gpu_mem_gib is None:
        raise UsageError("recipe needs the GPU's memory", "pass --platform platform.json (from `hotsplit probe`) "
                         "or --gpu-mem-gib G")
    if gpu_mem_gib is not None and gpu_mem_gib <= 0:
        raise UsageError(f"--gpu-mem-gib: must be > 0, got {gpu_mem_gib}")
    host, host_source, gpu = None, "", "unknown"
    if platform_path is not None:
        info = load_platform(platform_path)
        if info.host_mem_available_bytes:
            host, host_source = info.host_mem_available_bytes / GIB, f"{platform_path}: host memory available"
        if gpu_mem_gib is None:
            g = info.gpus[0] if info.gpus else None
            if g is None or not g.mem_total_bytes:
                raise UsageError(f"--platform {platform_path}: the probe found no GPU memory", "pass --gpu-mem-gib G")
            return HardwareChoice(g.name or "unknown", round(g.mem_total_bytes / GIB, 2),
                                  f"{platform_path}: GPU {g.index} total memory", host, host_source)
    return HardwareChoice(gpu, gpu_mem_gib, "--gpu-mem-gib", host, host_source)


UNKNOWN_GPU = HardwareChoice("unknown", None, "unknown: set it, or give plan and run --hot-gib")


def _relative(path: Path, out_dir: Path) -> str:
    """`path` as a recipe names it: relative to the recipe's folder (recipes resolve it so)."""
    return os.path.relpath(path.resolve(), out_dir.resolve())


def _line(key: str, value, source: str, indent: int = 2) -> str:
    text = f"{' ' * indent}{key}: {json.dumps(value)}"  # JSON scalars and lists are YAML
    return f"{text:<40} # {source}" if source else text


def _model_lines(config: dict, geom: CheckpointGeometry, params: ParamCount, folder: Path, out_dir: Path) -> list[str]:
    c = "config.json "
    family = geom.family
    q = quant_method(config)
    dtype_source = f"{c}quantization_config.quant_method" if q else f"{c}{key_used(config, ('dtype', 'torch_dtype'))}"
    rows = [("kind", "hf", "a Hugging Face checkpoint"),
            ("path", _relative(folder, out_dir), "the checkpoint (relative to this file)"),
            ("name", folder.resolve().name, "the checkpoint folder's name (balance names histograms so)"),
            ("family", family, f"{c}model_type"), ("hidden_size", geom.hidden_size, f"{c}hidden_size"),
            ("moe_intermediate_size", geom.moe_intermediate_size, c + expert_size_key(family)),
            ("num_hidden_layers", geom.num_hidden_layers, f"{c}num_hidden_layers"),
            ("moe_layers", list(geom.moe_layer_ids), c + MOE_LAYER_RULES[family]),
            ("num_experts", geom.num_experts, c + key_used(config, EXPERT_KEYS)),
            ("top_k", geom.top_k, c + key_used(config, TOP_K_KEYS)),
            ("num_shared_experts", geom.num_shared_experts, c + ("shared_expert_intermediate_size"
                                                                 if family == "qwen2_moe" else "n_shared_experts")),
            ("shared_intermediate_size", geom.shared_intermediate_size, "shared experts x their size"),
            ("router", geom.router, f"{family}'s router"),
            ("norm_topk_prob", geom.norm_topk_prob, f"{c}norm_topk_prob"),
            ("n_group", geom.n_group, f"{c}n_group"), ("topk_group", geom.topk_group, f"{c}topk_group"),
            ("routed_scaling_factor", geom.routed_scaling_factor, f"{c}routed_scaling_factor"),
            ("expert_dtype", geom.expert_dtype, dtype_source),
            ("expert_bias", geom.expert_bias, f"{family} experts carry biases" if geom.expert_bias else "no biases"),
            ("dense_dtype_bytes", geom.dense_dtype_bytes, "the non-expert weights' dtype"),
            ("total_params", int(params.total_params), params.source),
            ("active_params", int(params.active_params), "computed: total - routed experts x (1 - top_k / experts)")]
    return ["model:"] + [_line(k, v, s) for k, v, s in rows]


def write_checkpoint_recipe(model: str | Path, out_path: Path, hardware: HardwareChoice, ep: int = 1, tp: int = 1,
                            prompts: Path | None = None) -> WrittenRecipe:
    """The recipe of the checkpoint at `model` (a folder, or its config.json with or without
    the weights beside it), parsed and checked as any recipe is; the caller writes `text`."""
    config_file = config_path_of(model)
    folder = config_file.parent
    config = read_checkpoint_config(config_file)
    geom = geometry_of(config, str(config_file))
    params = count_params(folder, config, geom)
    out_dir = out_path.parent
    lines = [f"# Written by `hotsplit recipe` from {config_file}; each value says where it came from.",
             f"name: {json.dumps(out_path.stem)}",
             *_model_lines(config, geom, params, folder, out_dir),
             "parallel:", _line("tp", tp, "--tp"), _line("ep", ep, "--ep"),
             "hardware:", _line("gpu", hardware.gpu, hardware.gpu_source),
             _line("gpu_mem_gib", hardware.gpu_mem_gib, hardware.gpu_source),
             *([_line("host_mem_gib", round(hardware.host_mem_gib, 2), hardware.host_source)]
               if hardware.host_mem_gib is not None else []),
             _line("kv_cache_gib", 0.0, "set the KV cache your server reserves per GPU")]
    if prompts is not None:
        lines += ["traffic:", _line("kind", "prompts", "--prompts"), _line("path", _relative(prompts, out_dir),
                                                                          "--prompts (relative to this file)")]
    else:
        lines += ["# traffic: no --prompts; `hotsplit balance --model ... --prompts F` or a traffic section runs it"]
    text = "\n".join(lines) + "\n"
    return WrittenRecipe(text, parse_recipe(yaml.safe_load(text), out_path), geom, params)
