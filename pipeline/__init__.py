"""corpusmill's orchestration: config, Dask engine, stage order, run directory, ledger, report, CLI."""
__version__ = "0.1.0"
