"""Expert parallelism: `hotsplit run` on N ranks with torch.distributed (docs/runtime.md).

Words (besides the runtime's glossary in runtime/__init__.py):
- **rank**: one process of the job, one GPU (or a share of one, or a CPU); `node`: its machine;
  `local rank`: its index there.
- **placement**: which logical expert each physical slot holds (`phy2log` [L, P]); slot p lives
  on rank p // (P / R). Without a placement file the layout is contiguous.
- **replica rule**: which replica serves each routed assignment (hotsplit_cli/placement/dispatch.py).
- **load**: the routed assignments a rank receives in one exchange (one step, one layer);
  **balancedness**: sum of mean rank loads / sum of max rank loads over the exchanges."""
