"""Expert parallelism: `hotsplit run` on N ranks with torch.distributed.

Words (besides the runtime's glossary in runtime/__init__.py):

- **rank**: one process of the job, one GPU (or a share of one, or a CPU); `node`: the machine it
  runs on; `local rank`: its index on that node.
- **placement**: which logical expert each physical slot holds (`phy2log` [L, P]); slot p lives
  on rank p // (P / R). Without a placement file the layout is contiguous.
- **replica rule**: which replica serves each routed assignment
  (hotsplit_cli/placement/dispatch.py, shared with every prediction).
- **load**: the routed assignments a rank receives in one exchange (one step, one layer);
  **balancedness**: sum of mean rank loads / sum of max rank loads over the exchanges.

Layout, one job per file: launch.py joins the group (torchrun) or launches the local ranks
(torch's elastic agent, each rank runtime/rank.py) and turns a failed rank into one error line;
channel.py brings rank 0's events back to the launcher; refusal.py says a refusal once for a
job's ranks; dispatch.py the exchange (`ep_exchange`) and the rank's MoE stack (checkpoint.py: a
checkpoint's, in lockstep); shared_bank.py
the cold bank shared by a node's ranks; rank.py a rank's context for the builders and its hooks
of the one loop; summary.py the job's figures reduced on rank 0; job.py each rank's run.
"""
