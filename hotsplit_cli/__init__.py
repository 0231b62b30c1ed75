"""hotsplit: plan which MoE experts stay hot in GPU memory, and prove the plan with a UVA runtime.

This package is the UI-free planning library (numpy only) plus the thin CLI that renders it.
torch is never imported here at module level: the runtime imports the planner, never the reverse.
"""

__version__ = "0.1.0"
