"""`hotsplit export`: a plan or a placement in the file formats of outside serving engines.

One module per engine, each a pure function from the plan's hot sets or the placement's maps to
the engine's own structure, the flags that start it with that file, and what it will keep on the
GPU. `targets.py` says which engine takes which file kind; `source.py` reads and checks it.
Serialising (JSON, YAML, torch's `.pt`, text) is the command's job.
"""
