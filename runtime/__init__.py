"""The embedded hot/cold MoE runtime (torch).

Glossary (the words used throughout this package):

- **logical expert**: expert `e` of MoE layer `l` as the model defines it, id `(l, e)`.
- **physical expert**: one copy of a logical expert's weights in some memory. Every expert has
  a physical copy in the cold bank; a hot expert has a second one in a hot slot.
- **cold**: an expert served from the cold bank, pinned host memory that the GPU reads in place
  over PCIe through a zero-copy device view (UVA). No staging copy is made.
- **hot**: an expert served from a slot in device memory.
- **slot**: one expert-sized row of a layer's hot bank. `expert2slot[e]` is the slot of expert
  `e`, or -1 when it is cold; `slot2expert[s]` is its inverse.
- **staging row**: a row of a layer's hot bank past its hot slots that holds one predicted cold
  expert for one step (prefetch; prefetch.py), read through `expert2slot` as a slot is.
- **bank**: one per MoE layer, the cold bank (all experts) plus the hot slots and the map.
- **blob**: one expert's weights as one contiguous row, `w13` [2I, H] then `w2` [H, I] (for
  block-scaled fp8: the two in e4m3, then their float32 scales), so a swap is a single copy.

Shape letters: T = tokens of a step, K = top_k, E = routed experts, S = hot slots of a layer,
H = hidden size, I = expert intermediate size, B = elements of one blob, L = MoE layers.

Layout: device.py chooses the device once; pinned.py allocates page-locked slabs of their own
size under the `numa_policy` knob (the pages and their lifetime are probes/hostmem.py's); bank.py keeps
slot bookkeeping (SlotTable) apart from byte movement (BlobBank, BlobLayout; ExpertBank is the
synthetic SwiGLU layout); fp8.py the block-scaled fp8 format; moe.py holds the router, SwiGLU
and the all-resident reference; kernels.py the expert compute (Triton on a GPU, its jit kernels
in triton_kernels.py, imported only where Triton runs; a torch path of the same computation on a
CPU); model.py stacks layers; engine.py drives steps and the CUDA graph; windows.py the hit-rate
accounting, dynamic swaps and run summary shared with checkpoint serving (hf/); from_recipe.py
turns a recipe into a ready engine; api.py is the shell's one door in (request.py: what a run is
asked and gives back; driver.py: one rank built and stepped; rank.py: a launched rank's entry
point); prefetch.py what each step stages and its counters; log.py the hit-rate records; selftest.py checks the runtime
on this machine's device; torch_files.py reads tensors-only .pt files.
"""
