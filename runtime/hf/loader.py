"""Load a local Hugging Face MoE checkpoint for hotsplit: a meta-device skeleton, then one
safetensors tensor at a time. Routed-expert tensors go straight into each layer's pinned cold
bank (never a second full copy in host memory, never all on the GPU); every other tensor goes to
the device. Attention, norms, embeddings, routers and dense / shared MLPs stay transformers'.

Checkpoint keys are the hub's: per-expert `...experts.{e}.{gate_proj|up_proj|down_proj}.weight`
(Mixtral: `block_sparse_moe.experts.{e}.{w1|w3|w2}.weight`), or fused `...experts.gate_up_proj`
[E, ...] / `down_proj` (+ `_bias`, gpt-oss), or gpt-oss's MXFP4 release (`..._blocks` /
`..._scales`: they stay mxfp4 in the cold bank, runtime/precision.py). Block-scaled fp8
(runtime/fp8.py) experts stay fp8 in the cold bank, every other quantised weight is dequantised
at load. Other quantised checkpoints (bitsandbytes, GPTQ/AWQ) are refused naming the method.
At another stored precision (`precision`: fp8 or mxfp4) each routed expert is quantised once,
as its tensors enter the cold bank (runtime/precision.py `checkpoint_stored_format` says which
releases go to which precision). At precision auto each expert is stored at its plan's precision:
a layer of several is a `MixedBank` (runtime/mixed_bank.py) of one bank per precision.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hotsplit_cli.core.errors import InputFileError, UsageError

from ..device import DeviceInfo
from ..fp8 import FP8, Fp8Format, dequantize
from ..kernels import TritonExperts
from ..memory import check_device_memory, check_host_memory
from ..mixed_bank import MixedBank
from ..pinned import PinnedAllocator, numa_policy_for
from ..precision import checkpoint_stored_format, precision_of, stored_format_of
from .adapter import MoELayerInfo, RoutingCounter, find_moe_layers, install
from .bank import ExpertLayout, HFExpertBank

# model_type values whose experts this adapter has been checked against (tests/test_hf_*.py).
FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "deepseek_v3", "glm4_moe", "mimo_v2_flash", "gpt_oss")

_PER_EXPERT = re.compile(
    r"^(?P<prefix>.*?)layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe)\.experts\.(?P<e>\d+)\."
    r"(?P<proj>gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
_FUSED = re.compile(
    r"^(?P<prefix>.*?)layers\.(?P<layer>\d+)\.(?:mlp|block_sparse_moe)\.experts\."
    r"(?P<name>gate_up_proj|down_proj|gate_up_proj_bias|down_proj_bias|gate_up_proj_blocks|gate_up_proj_scales"
    r"|down_proj_blocks|down_proj_scales)$")
_PROJ = {"gate_proj": ("w1", 0), "w1": ("w1", 0), "up_proj": ("w1", 1), "w3": ("w1", 1),
         "down_proj": ("w2", None), "w2": ("w2", None)}
_FUSED_PART = {"gate_up_proj": "w1", "down_proj": "w2", "gate_up_proj_bias": "b1", "down_proj_bias": "b2",
               # gpt-oss's MXFP4 release (runtime/precision.py)
               "gate_up_proj_blocks": "w1", "down_proj_blocks": "w2", "gate_up_proj_scales": "s1",
               "down_proj_scales": "s2"}
_FUSED_WEIGHTS = {"gate_up_proj": 2, "down_proj": 1, "gate_up_proj_blocks": 2, "down_proj_blocks": 1}  # parts counted
# Non-expert checkpoint names that differ from the module tree (transformers' conversion_mapping.py).
_RENAMES = {"mixtral": ((".block_sparse_moe.", ".mlp."),),
            "mimo_v2_flash": (("self_attn.attention_sink_bias", "self_attn.sinks"),)}


@dataclass
class HFModel:
    """A loaded checkpoint with hotsplit's experts installed."""

    model: torch.nn.Module
    layers: list[MoELayerInfo]
    banks: list[HFExpertBank | MixedBank]  # a MixedBank where an auto plan stores a layer at several precisions
    counter: RoutingCounter
    family: str
    released: str = "native"  # the precision its routed experts are released in: native, fp8 or mxfp4

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(i.layer_id for i in self.layers)

    @property
    def num_experts(self) -> int:
        return self.layers[0].num_experts

    @property
    def top_k(self) -> int:
        return self.layers[0].top_k


@contextlib.contextmanager
def _params_on_meta():
    """Build modules with parameters on the meta device and buffers for real (rotary tables are
    computed at construction and are not in the checkpoint)."""
    original = torch.nn.Module.register_parameter

    def register(self, name, param):
        original(self, name, param)
        if param is not None and param.device.type != "meta":
            p = self._parameters[name]
            self._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def _checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise InputFileError(f"{path}: no *.safetensors files", "hotsplit reads safetensors checkpoints only")
    return files


def read_config(path: str | Path):
    """The checkpoint's config, checked: a supported family, not quantised or block-scaled fp8.
    The fp8 or mxfp4 format is kept as `config.hotsplit_fp8` and `quantization_config` is removed, so
    that transformers builds plain modules (hotsplit dequantises what it loads)."""
    from transformers import AutoConfig

    path = Path(path)
    if not path.is_dir():
        raise InputFileError(f"{path}: no such folder" if not path.exists() else f"{path}: is a file, not a folder",
                             "point --model at a Hugging Face checkpoint folder")
    if not (path / "config.json").is_file():
        raise InputFileError(f"{path}: no config.json", "point --model at a checkpoint folder")
    config = AutoConfig.from_pretrained(path)
    mtype = getattr(config, "model_type", "?")
    if mtype not in FAMILIES:
        raise UsageError(f"{path}: model_type {mtype!r} is not supported", f"supported: {', '.join(FAMILIES)}")
    config.hotsplit_fp8 = stored_format_of(config, str(path))
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    return config


SCALE_SUFFIX = "_scale_inv"


class _ScaleReader(contextlib.ExitStack):
    """The `<weight>_scale_inv` tensor of a fp8 weight, wherever it is in the checkpoint's files
    (each file opened when first needed, all closed with the reader)."""

    def __init__(self, files: list[Path], where: Path):
        from safetensors import safe_open

        super().__init__()
        self.where = where
        self._file_of: dict[str, Path] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                self._file_of.update((k, file) for k in f.keys() if k.endswith(SCALE_SUFFIX))
        self._open: dict[Path, object] = {}

    def of(self, weight_key: str) -> torch.Tensor:
        from safetensors import safe_open

        key = weight_key + SCALE_SUFFIX
        file = self._file_of.get(key)
        if file is None:
            raise InputFileError(f"{self.where}: {weight_key} is fp8 but {key} is missing")
        if file not in self._open:
            self._open[file] = self.enter_context(safe_open(str(file), framework="pt"))
        return self._open[file].get_tensor(key)


def _fp32_names(model: torch.nn.Module, dtype: torch.dtype) -> list[str]:
    """transformers' rule: `_keep_in_fp32_modules_strict` stays fp32 under bf16/fp16,
    `_keep_in_fp32_modules` only under fp16."""
    names: list[str] = []
    if dtype in (torch.bfloat16, torch.float16):
        names += list(getattr(model, "_keep_in_fp32_modules_strict", None) or [])
    if dtype == torch.float16:
        names += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return names


def _set_tensor(model: torch.nn.Module, name: str, tensor: torch.Tensor, device, dtype) -> None:
    """Put a checkpoint tensor in place of the skeleton's parameter or buffer of the same shape."""
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    old = module._parameters.get(attr, module._buffers.get(attr))
    if old is not None and tuple(old.shape) != tuple(tensor.shape):
        raise ValueError(f"shape {tuple(tensor.shape)}, the model expects {tuple(old.shape)}")
    if attr in module._parameters:
        module._parameters[attr] = torch.nn.Parameter(tensor.to(device=device, dtype=dtype), requires_grad=False)
    elif attr in module._buffers:
        module._buffers[attr] = tensor.to(device=device, dtype=dtype)
    else:
        raise KeyError(name)


def _check_memory(path: Path, model: torch.nn.Module, layers: list[MoELayerInfo],
                  layouts: list[list[tuple[np.ndarray, ExpertLayout]]], dtype: torch.dtype, info: DeviceInfo) -> None:
    """Refuse before loading a byte when the cold banks do not fit in host memory or the rest of
    the model (on the device) does not fit in the GPU's free memory (`layouts`: per layer, the
    experts stored in each layout)."""
    bank = sum(len(ids) * b.elems * b.storage.itemsize for row in layouts
               for ids, b in ((ids, lay.blob_layout(dtype)) for ids, lay in row))
    check_host_memory(bank, f"{path}: the cold banks need", "use a machine with more RAM, or a smaller model")
    experts = {id(p) for i in layers for p in i.experts.parameters()}
    dense = sum(p.numel() * dtype.itemsize for p in model.parameters() if id(p) not in experts)
    check_device_memory(dense, info, f"{path}: the weights that stay on the device (attention, embeddings, dense and "
                        "shared MLPs) need", "use a GPU with more memory")


class _CheckpointReader:
    """Puts each tensor of a checkpoint where it belongs, by the kind of its key: a per-expert
    projection or fused experts go into the layer's cold bank, an fp8 scale is read with its
    weight, every other tensor replaces the skeleton's parameter or buffer (dense)."""

    def __init__(self, path: Path, model: torch.nn.Module, config, layers: list[MoELayerInfo],
                 banks: list[HFExpertBank], dtype: torch.dtype, device: torch.device, fills: bool):
        self.path, self.model, self.layers, self.dtype, self.device = path, model, layers, dtype, device
        self.fills = fills  # this process writes the cold banks (a node-shared bank is written by one rank)
        self.layer_of = {i.layer_id: i for i in layers}
        self.bank_of = {i.layer_id: banks[i.row] for i in layers}
        released = config.hotsplit_fp8  # fp8 reads scale files beside its weights; mxfp4 keeps scales in the experts
        self.fp8 = released if isinstance(released, Fp8Format) else None
        self.released = precision_of(released)  # a bank stored otherwise quantises once, here
        self.scales: _ScaleReader | None = None
        self.fp32 = _fp32_names(model, dtype)
        self.renames = _RENAMES.get(config.model_type, ())
        self.params = dict(model.named_parameters()) | dict(model.named_buffers())
        self.parts_LE = np.zeros((len(layers), layers[0].num_experts), dtype=np.int64)  # parts seen per expert

    def read(self, files: list[Path]) -> None:
        """Every tensor of `files`, one at a time; then check that every expert is complete."""
        from safetensors import safe_open

        with _ScaleReader(files, self.path) if self.fp8 is not None else contextlib.nullcontext() as self.scales:
            for file in files:
                with safe_open(str(file), framework="pt") as f:
                    for key in f.keys():
                        handler, m = self._handler_of(key)
                        handler(f, key, m)
        short = np.argwhere(self.parts_LE < 3)
        if len(short) and self.fills:
            li, e = short[0]
            raise InputFileError(f"{self.path}: expert {e} of layer {self.layers[li].layer_id} is missing from the "
                                 "checkpoint")

    def _handler_of(self, key: str):
        if self.scales is not None and key.endswith(SCALE_SUFFIX):
            return self._skip, None
        for handler, pattern in ((self._expert, _PER_EXPERT), (self._fused, _FUSED)):
            m = pattern.match(key)
            if m and int(m["layer"]) in self.layer_of:
                return (handler if self.fills else self._skip), m
        return self._dense, None

    @contextlib.contextmanager
    def _naming(self, key: str, errors=(ValueError, RuntimeError), hint: str | None = None):
        """A tensor the model cannot take becomes an input error naming the checkpoint and key."""
        try:
            yield
        except errors as exc:
            raise InputFileError(f"{self.path}: {key}: {exc}", hint) from None

    def _skip(self, f, key: str, m) -> None:
        """An fp8 `<weight>_scale_inv` (read with its weight by `_ScaleReader`), or an expert
        tensor that another rank of the node writes into the shared cold bank."""

    def _target(self, lid: int, e: int) -> tuple[HFExpertBank, int, bool]:
        """The bank that stores expert e of layer `lid`, its id there, and whether that bank
        quantises it (stored at another precision than released)."""
        bank = self.bank_of[lid]
        sub, local = bank.sub_of(e) if isinstance(bank, MixedBank) else (bank, e)
        return sub, local, sub.precision != self.released

    def _expert(self, f, key: str, m: re.Match) -> None:
        """One projection of one expert (gate and up are halves of the bank's w1)."""
        lid, e = int(m["layer"]), int(m["e"])
        part, half = _PROJ[m["proj"]]
        bank, local, quantises = self._target(lid, e)
        t = f.get_tensor(key)
        rows = None if half is None else slice(half * t.shape[0], (half + 1) * t.shape[0])
        with self._naming(key):
            if quantises:  # native weights (an fp8 release's dequantised) to the bank's stored precision
                native = t if self.fp8 is None else dequantize(t, self.scales.of(key), self.fp8, torch.float32)
                bank.load_native(local, part, native, rows)
            else:
                bank.load_part(local, part, t, rows)
            if self.fp8 is not None and not quantises:  # the block scales of this projection, kept beside it
                bank.load_part(local, "s1" if part == "w1" else "s2", self.scales.of(key), half)
        self.parts_LE[self.layer_of[lid].row, e] += 1

    def _fused(self, f, key: str, m: re.Match) -> None:
        """One [E, ...] tensor of every expert of a layer, copied one expert at a time."""
        lid = int(m["layer"])
        if self.fp8 is not None:
            raise InputFileError(f"{self.path}: {key}: fused fp8 experts are not supported",
                                 "use a checkpoint with per-expert weights")
        sl = f.get_slice(key)
        with self._naming(key):
            for e in range(self.layer_of[lid].num_experts):  # one expert at a time: no full copy
                bank, local, quantises = self._target(lid, e)
                (bank.load_native if quantises else bank.load_part)(local, _FUSED_PART[m["name"]], sl[e])
        self.parts_LE[self.layer_of[lid].row] += _FUSED_WEIGHTS.get(m["name"], 0)

    def _dense(self, f, key: str, m=None) -> None:
        """Any other tensor: to the device in the model's dtype (fp8 dequantised), in place of the
        skeleton's tensor of the same name."""
        name = key
        for old, new in self.renames:
            name = name.replace(old, new)
        if name not in self.params:
            return  # e.g. MTP layers a causal-LM skeleton does not build
        want = torch.float32 if any(p in name for p in self.fp32) else self.dtype
        if self.params[name].dtype.is_floating_point is False:
            want = self.params[name].dtype
        t = f.get_tensor(key)
        if t.dtype == FP8:
            if self.scales is None:
                raise InputFileError(f"{self.path}: {key} is fp8 but config.json names no fp8 quantization")
            with self._naming(key, ValueError):
                t = dequantize(t, self.scales.of(key), self.fp8, torch.float32)
        with self._naming(key, ValueError, "is config.json the checkpoint's own?"):
            _set_tensor(self.model, name, t, self.device, want)


def _finish(path: Path, model: torch.nn.Module, config, layers: list[MoELayerInfo], dtype: torch.dtype,
            device: torch.device) -> None:
    """After the checkpoint is read: drop the experts' own parameters, tie embeddings, refuse a
    model with tensors still on meta, move computed buffers to the device."""
    for i in layers:  # the experts' own parameters are never used: the bank serves them
        for pname in list(i.experts._parameters):
            i.experts._parameters[pname] = torch.nn.Parameter(torch.empty(0, device=device, dtype=dtype),
                                                               requires_grad=False)
    if any(getattr(c, "tie_word_embeddings", False) for c in (config, config.get_text_config())):
        model.tie_weights()
    missing = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise InputFileError(f"{path}: {len(missing)} tensors missing from the checkpoint, e.g. {missing[:3]}")
    for mod in model.modules():  # computed buffers (rotary tables) to the device
        for bname, buf in list(mod._buffers.items()):
            if buf is not None and buf.device != device:
                mod._buffers[bname] = buf.to(device)


def load_model(path: str | Path, info: DeviceInfo, dtype: torch.dtype | None = None,
               keep_trace: bool = False, allocator: PinnedAllocator | None = None,
               precision: str = "native", precision_LE: np.ndarray | None = None) -> HFModel:
    """Load the checkpoint at `path` with every routed expert in a pinned cold bank (all cold;
    set hot sets with `bank.set_hot`), stored at `precision`, or at auto each at its precision in
    `precision_LE` (str [MoE layers, E], an auto plan's). `dtype` defaults to the checkpoint's;
    `allocator` places the cold bank (default: pinned where CUDA is, no NUMA policy); an allocator
    that does not fill (`fills`: a node-shared bank another rank writes) maps the bank and skips the experts."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    config = read_config(path)
    dtype = dtype or getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    with _params_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    layers = find_moe_layers(model)
    if not layers:
        raise UsageError(f"{path}: no MoE layer found in {type(model).__name__}")
    layouts = _layer_layouts(path, layers, config.hotsplit_fp8, precision, precision_LE)
    _check_memory(path, model, layers, layouts, dtype, info)
    fills = getattr(allocator, "fills", True)
    allocator = allocator or PinnedAllocator(pin=info.pinned, numa=numa_policy_for("off", None))
    swap_stream = torch.cuda.Stream(info.device) if info.is_cuda else None
    banks = [_layer_bank(row, dtype, info, allocator, swap_stream) for row in layouts]
    _CheckpointReader(path, model, config, layers, banks, dtype, info.device, fills).read(_checkpoint_files(path))
    _finish(path, model, config, layers, dtype, info.device)
    counter = RoutingCounter(len(layers), layers[0].num_experts, keep_trace=keep_trace)
    install(model, counter, banks)
    return HFModel(model, layers, banks, counter, config.model_type, precision_of(config.hotsplit_fp8))


def _layer_layouts(path: Path, layers: list[MoELayerInfo], released, precision: str,
                   precision_LE: np.ndarray | None) -> list[list[tuple[np.ndarray, ExpertLayout]]]:
    """Per MoE layer, (expert ids, their layout) per stored precision: every expert at `precision`,
    or at auto at its precision in `precision_LE`; UsageError where a precision cannot store the
    release, or the precisions do not have one row per MoE layer and one column per expert."""
    E = layers[0].num_experts
    if precision != "auto":
        precision_LE = np.full((len(layers), E), precision, dtype=object)
    elif precision_LE is None or np.shape(precision_LE) != (len(layers), E):
        raise UsageError(f"{path}: precision auto needs each expert's precision for {len(layers)} MoE layers x {E} "
                         f"experts, got shape {None if precision_LE is None else np.shape(precision_LE)}",
                         "pass a plan made with `hotsplit plan --precision auto` for this checkpoint")
    out = []
    for i, row in zip(layers, np.asarray(precision_LE).astype(str), strict=True):
        out.append([(np.flatnonzero(row == name), ExpertLayout.of_module(
            i.experts, checkpoint_stored_format(released, name, str(path)))) for name in sorted(set(row))])
    return out


def _layer_bank(layouts: list[tuple[np.ndarray, ExpertLayout]], dtype: torch.dtype, info: DeviceInfo,
                allocator: PinnedAllocator, swap_stream) -> HFExpertBank | MixedBank:
    """One MoE layer's bank, all cold: one precision's, or a MixedBank of one bank per precision;
    the plain SwiGLU layout runs the expert-grouped kernels wherever Triton does."""
    banks = [HFExpertBank(lay, len(ids), dtype, info, allocator, swap_stream,
                          TritonExperts() if info.triton and lay.plain_swiglu else None) for ids, lay in layouts]
    return banks[0] if len(banks) == 1 else MixedBank([ids for ids, _ in layouts], banks, info)


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(Path(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    return tok
