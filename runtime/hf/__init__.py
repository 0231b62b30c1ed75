"""Hugging Face checkpoints on the hot/cold runtime, through transformers' experts interface.

adapter.py registers the `"hotsplit"` experts implementation (exact routing counts and the
bank's expert compute); bank.py is one MoE layer's cold bank / hot slots in the model's own
expert layout; loader.py builds the model from a checkpoint folder with the experts going
straight into the cold bank; capture.py drives prompts through the model for `hotsplit balance`.
"""
