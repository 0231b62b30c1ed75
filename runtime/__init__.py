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

Layout, one job per file: docs/architecture.md ("The driver of a run") and docs/runtime.md.
"""
