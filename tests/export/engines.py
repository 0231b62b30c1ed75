"""The engines' own selection and loading code, taken from their installed packages: each needed
function is read from the package's source file and run with its heavy imports stubbed, so the
tests check what the engine does with an exported file, not what hotsplit believes it does.

TensorRT-LLM's PyPI package is a stub and llama.cpp is C++: their rules are transcribed here from
the source cited in docs/export.md, and the tests run the transcription.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
ASCEND = ROOT / ".venv" / "engines" / "vllm_ascend-0.23.0.post1" / "vllm_ascend"
MISSING = "run scripts/install_engine_checks.sh"


def package_file(module: str, relative: str) -> Path:
    """A source file of an installed package; skip (with the reason) when it is not installed."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{module} is not installed ({MISSING})")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        pytest.skip(f"{path} not found in the installed {module}")
    return path


def load_defs(path: Path, names: tuple[str, ...], namespace: dict) -> dict:
    """Execute only the top-level functions / classes `names` of `path` in `namespace`."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name in names]
    missing = set(names) - {n.name for n in nodes}
    assert not missing, f"{path} no longer defines {missing}: re-read the engine"
    exec(compile(ast.Module(nodes, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    return namespace


def kt_masks(pt_file: Path, ratio: str, hf_config: SimpleNamespace):
    """SGLang-kt's `_init_kt_gpu_experts_masks` on `pt_file` (strategy frequency, TP rank 0)."""
    import torch

    base = load_defs(package_file("kt_kernel", "experts_base.py"), ("generate_gpu_experts_masks",),
                     {"torch": torch, "Optional": Optional})
    ns = load_defs(package_file("sglang", "srt/layers/moe/kt_ep_wrapper.py"), ("_init_kt_gpu_experts_masks",), {
        "torch": torch, "Optional": Optional, "logger": logging.getLogger("kt-check"), "_KT_GPU_EXPERTS_MASKS": None,
        "generate_gpu_experts_masks": base["generate_gpu_experts_masks"],
        "get_tensor_model_parallel_rank": lambda: 0, "dist": SimpleNamespace(is_initialized=lambda: False)})
    args = SimpleNamespace(get_hf_config=lambda: hf_config, kt_gpu_experts_ratio=float(ratio),
                           kt_num_gpu_experts=None, kt_expert_placement_strategy="frequency",
                           init_expert_location=str(pt_file))
    return ns["_init_kt_gpu_experts_masks"](args).numpy()


def ascend_layout(map_file: Path, num_layers: int, num_experts: int, ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """vllm-ascend's `init_eplb_config` for every MoE layer and EP rank: the expert in each
    physical slot [L, P] (rank r's local slot i is global slot r * P / R + i) and each rank's
    log2phy [L, R, E]."""
    import torch

    if not (ASCEND / "eplb" / "core" / "eplb_utils.py").is_file():
        pytest.skip(f"vllm-ascend sources not found under {ASCEND} ({MISSING})")
    config = load_defs(ASCEND / "ascend_config.py", ("EplbConfig",), {"os": __import__("os"),
                                                                       "logger": logging.getLogger("ascend-check")})
    config["EplbConfig"]({"expert_map_path": str(map_file)})  # the suffix and existence checks
    ns = load_defs(ASCEND / "eplb" / "core" / "eplb_utils.py",
                   ("expert_file_to_tensor", "generate_log2phy_map", "init_eplb_config"),
                   {"json": json, "torch": torch, "np": np, "defaultdict": defaultdict,
                    "logger": logging.getLogger("ascend-check"), "determine_expert_map": None})
    real = ns["generate_log2phy_map"]
    ns["generate_log2phy_map"] = lambda *a, **k: SimpleNamespace(npu=lambda: real(*a, **k))  # no NPU here
    eplb = SimpleNamespace(expert_map_path=str(map_file), dynamic_eplb=False, num_redundant_experts=0)
    slots, log2phy = [], np.zeros((num_layers, ranks, num_experts), dtype=np.int64)
    for k in range(num_layers):
        row = []
        for r in range(ranks):
            moe = SimpleNamespace(num_experts=num_experts, ep_size=ranks, ep_rank=r)
            _, local, l2p, _ = ns["init_eplb_config"](eplb, k, moe)
            local = local.numpy()
            order = np.argsort(np.where(local >= 0, local, np.iinfo(np.int32).max))[: int((local >= 0).sum())]
            row += order.tolist()  # expert of local slot 0, 1, ...
            log2phy[k, r] = l2p.numpy()
        slots.append(row)
    return np.array(slots), log2phy


def trtllm_rank_slots(yaml_file: Path, layer_ids, num_experts: int, ep_size: int) -> dict[int, list[list[int]]]:
    """TensorRT-LLM's MoeLoadBalancerConfig (tensorrt_llm/llmapi/llm_args.py, a StrictBaseModel)
    and the MoE module's checks of a layer's initial assignments, transcribed: each layer's
    experts per rank, rank r holding slots [slot_start, slot_end)."""
    import yaml
    from pydantic import BaseModel, ConfigDict, PrivateAttr

    class MoeLoadBalancerConfig(BaseModel):
        model_config = ConfigDict(extra="forbid")
        num_slots: Optional[int] = None  # noqa: UP045 - as the engine declares it
        initial_global_assignments: Optional[dict[int, list[int]]] = None  # noqa: UP045
        layer_updates_per_iter: int = 0
        _ep_rank: Optional[int] = PrivateAttr(default=None)  # noqa: UP045
        _ep_size: Optional[int] = PrivateAttr(default=None)  # noqa: UP045

        def setup(self, ep_rank: int, ep_size: int) -> None:
            self._ep_rank, self._ep_size = ep_rank, ep_size
            if self.num_slots is None:
                raise ValueError("`num_slots` cannot be None when calling setup().")
            if self.num_slots % ep_size != 0:
                raise ValueError(f"`num_slots` ({self.num_slots}) must be divisible by `ep_size` ({ep_size}).")

        @property
        def slot_start(self) -> int:
            return self._ep_rank * (self.num_slots // self._ep_size)

        @property
        def slot_end(self) -> int:
            return self.slot_start + self.num_slots // self._ep_size

        def get_layer_initial_global_assignments(self, layer_idx: int):
            if layer_idx not in self.initial_global_assignments:
                raise KeyError(f"layer_idx {layer_idx} not found in `initial_global_assignments`.")
            assignments = self.initial_global_assignments[layer_idx]
            if len(assignments) != self.num_slots:
                raise ValueError(f"Assignment length ({len(assignments)}) does not match `num_slots`")
            return assignments

    doc = yaml.load(yaml_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    out = {layer: [] for layer in layer_ids}
    for r in range(ep_size):  # each rank builds its own config from the file
        cfg = MoeLoadBalancerConfig(**doc)
        cfg.setup(r, ep_size)
        for layer in layer_ids:
            loaded = cfg.get_layer_initial_global_assignments(layer)
            # the MoE module's own asserts (fused_moe: create the layer's load balancer)
            assert isinstance(loaded, list) and len(loaded) == cfg.num_slots >= num_experts
            assert set(loaded) == set(range(num_experts))
            out[layer].append(loaded[cfg.slot_start:cfg.slot_end])
    return out


# llama.cpp, common/common.h and common/arg.cpp (see docs/export.md)
LLM_FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def llamacpp_overrides(args: list[str]) -> list[tuple[str, str]]:
    """The tensor buffer overrides llama.cpp builds from `args`, in order: `--n-cpu-moe N` pushes
    `blk\\.i` + LLM_FFN_EXPS_REGEX -> CPU for i < N; `-ot` splits at `,`, then at the first `=`."""
    overrides, i = [], 0
    while i < len(args):
        if args[i] in ("--n-cpu-moe", "-ncmoe"):
            overrides += [(rf"blk\.{b}{LLM_FFN_EXPS_REGEX}", "CPU") for b in range(int(args[i + 1]))]
        elif args[i] in ("-ot", "--override-tensor"):
            for item in args[i + 1].split(","):
                pos = item.find("=")
                assert pos >= 0, "llama.cpp: invalid value"
                overrides.append((item[:pos], item[pos + 1:]))
        i += 1
    return overrides


def llamacpp_buffer(tensor: str, overrides: list[tuple[str, str]], default: str = "CUDA0") -> str:
    """The loader: the first override whose pattern std::regex_search finds in the name wins."""
    for pattern, buft in overrides:
        if re.search(pattern, tensor):
            return buft
    return default


def gguf_tensor_names(arch_name: str, num_blocks: int, first_moe: int) -> list[str]:
    """Every weight name of a GGUF of `arch_name`, from the gguf package's constants; dense blocks
    (below `first_moe`) have no expert, shared-expert or router tensors."""
    gguf = pytest.importorskip("gguf", reason=f"gguf is not installed ({MISSING})")
    arch = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch_name)
    names = []
    for t in gguf.MODEL_TENSORS[arch]:
        fmt = gguf.TENSOR_NAMES[t]
        if "{bid}" not in fmt:
            names.append(fmt + ".weight")
            continue
        for b in range(num_blocks):
            name = fmt.format(bid=b)
            moe_only = any(s in name for s in ("_exps", "_shexp", "gate_inp", "exp_probs"))
            if b >= first_moe or not moe_only:
                names.append(name + ".weight")
    return names


def sglang_server_flags() -> set[str]:
    """Every option string SGLang's server declares (`ServerArgs.add_cli_args` in
    sglang/srt/server_args.py), read from the source: importing it needs SGLang's whole stack."""
    tree = ast.parse(package_file("sglang", "srt/server_args.py").read_text())
    return {arg.value for call in ast.walk(tree) if isinstance(call, ast.Call)
            and getattr(call.func, "attr", None) == "add_argument"
            for arg in call.args if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")}


def ascend_eplb_command() -> str:
    """The `vllm serve` line of vllm-ascend's own static EPLB guide (the sdist's docs)."""
    doc = ASCEND.parent / "docs" / "source" / "user_guide" / "feature_guide" / "expert_parallelism_load_balancer.md"
    if not doc.is_file():
        pytest.skip(f"vllm-ascend docs not found at {doc} ({MISSING})")
    text = doc.read_text()
    start = text.rfind("vllm serve", 0, text.index('"expert_map_path"'))
    return text[start:text.index("```", start)]
