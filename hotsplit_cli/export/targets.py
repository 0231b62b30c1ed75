"""The engines `hotsplit export` writes for: one record per engine, with the file kind it takes,
the file names it reads and the function that builds its document. Every list of engines (the
command's help, its errors, the docs' table) comes from TARGETS."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from hotsplit_cli.core.errors import UsageError
from hotsplit_cli.export.ktransformers import export_ktransformers
from hotsplit_cli.export.llamacpp import export_llamacpp
from hotsplit_cli.export.result import EngineExport
from hotsplit_cli.export.sglang import export_sglang
from hotsplit_cli.export.source import ExportRequest, read_placement_source, read_plan_source
from hotsplit_cli.export.trtllm import export_trtllm
from hotsplit_cli.export.vllm_ascend import export_vllm_ascend
from hotsplit_cli.hotset.gpu_fit import gpu_fit


@dataclass(frozen=True)
class Target:
    engine: str
    takes: str  # plan | placement
    suffixes: tuple[str, ...]  # what the engine reads; anything else it ignores or misreads
    why: str  # what happens to another name
    build: Callable  # (PlanSource | PlacementSource, ExportRequest) -> EngineExport

    @property
    def read(self) -> Callable:
        """The reader of the file kind this engine takes."""
        return read_plan_source if self.takes == "plan" else read_placement_source


TARGETS = {t.engine: t for t in (
    Target("sglang", "placement", (".json",), "SGLang parses any other name as inline JSON", export_sglang),
    Target("ktransformers", "plan", (".pt",), "SGLang-kt reads activation counts only from a .pt, else it "
                                              "silently places experts uniformly", export_ktransformers),
    Target("trtllm", "placement", (".yaml", ".yml"), "TensorRT-LLM reads the load balancer config as YAML",
           export_trtllm),
    Target("vllm-ascend", "placement", (".json",), "vllm-ascend's EplbConfig refuses a path not ending in .json",
           export_vllm_ascend),
    Target("llama.cpp", "plan", (".txt",), "it holds llama.cpp's arguments as one line of text", export_llamacpp),
)}


def engines_text() -> str:
    """`sglang, ktransformers, ... or llama.cpp`: the engines as a sentence names them."""
    names = list(TARGETS)
    return f"{', '.join(names[:-1])} or {names[-1]}"


def recipe_engines() -> list[str]:
    """The engines that take a placement: they number layers as the model does, so they need the
    recipe (a placement made with `place --recipe` records it; older ones need --recipe)."""
    return [t.engine for t in TARGETS.values() if t.takes == "placement"]


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
    """Read and check FILE for the engine, build the engine's document, and judge whether the
    GPU experts it keeps fit the recipe's GPU."""
    target = check_request(req)
    src = target.read(req)
    result = target.build(src, req)
    return replace(result, gpu=gpu_fit(result.gpu_bytes, src.recipe))
