"""The engines `hotsplit export` writes for: the file kind each takes, the file names it reads,
and the function that builds its document."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.export.ktransformers import export_ktransformers
from hotsplit_cli.export.llamacpp import export_llamacpp
from hotsplit_cli.export.result import EngineExport
from hotsplit_cli.export.sglang import export_sglang
from hotsplit_cli.export.source import read_placement_source, read_plan_source
from hotsplit_cli.export.trtllm import export_trtllm
from hotsplit_cli.export.vllm_ascend import export_vllm_ascend


@dataclass(frozen=True)
class Target:
    takes: str  # plan | placement
    suffixes: tuple[str, ...]  # what the engine reads; anything else it ignores or misreads
    why: str  # what happens to another name


TARGETS = {
    "sglang": Target("placement", (".json",), "SGLang parses any other name as inline JSON"),
    "ktransformers": Target("plan", (".pt",), "SGLang-kt reads activation counts only from a .pt, else it "
                                              "silently places experts uniformly"),
    "trtllm": Target("placement", (".yaml", ".yml"), "TensorRT-LLM reads the load balancer config as YAML"),
    "vllm-ascend": Target("placement", (".json",), "vllm-ascend's EplbConfig refuses a path not ending in .json"),
    "llama.cpp": Target("plan", (".txt",), "it holds llama.cpp's arguments as one line of text"),
}


@dataclass(frozen=True)
class ExportRequest:
    path: Path
    engine: str
    output: Path
    recipe: str | None = None
    hist: Path | None = None  # the plan's histogram, when it moved
    online: int = 0  # trtllm: layers re-balanced per iteration


def check_request(req: ExportRequest) -> Target:
    """UsageError for an unknown engine or an output name the engine would not read (before any work)."""
    target = TARGETS.get(req.engine)
    if target is None:
        raise UsageError(f"--to {req.engine!r}: must be one of {', '.join(TARGETS)}")
    if req.output.suffix not in target.suffixes:  # exactly: the engines compare the name case-sensitively
        raise UsageError(f"-o {req.output}: --to {req.engine} needs a name ending in {' or '.join(target.suffixes)} "
                         f"({target.why})", f"name it {req.output.with_suffix(target.suffixes[0]).name}")
    if req.online and req.engine != "trtllm":
        raise UsageError("--online is TensorRT-LLM's layer_updates_per_iter", "drop it, or pass --to trtllm")
    return target


def export(req: ExportRequest) -> EngineExport:
    """Read and check FILE for the engine, then build the engine's document."""
    target = check_request(req)
    out = str(req.output)
    if target.takes == "plan":
        src = read_plan_source(req.path, req.engine, req.recipe, req.hist)
        return (export_ktransformers if req.engine == "ktransformers" else export_llamacpp)(src, out)
    src = read_placement_source(req.path, req.engine, req.recipe)
    if req.engine == "trtllm":
        return export_trtllm(src, out, req.online)
    return (export_sglang if req.engine == "sglang" else export_vllm_ascend)(src, out)
