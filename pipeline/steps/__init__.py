"""The steps of a run, one module per family; `pipeline/plan.py` decides which run and in what order."""
