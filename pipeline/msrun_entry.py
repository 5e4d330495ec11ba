"""Entry script for data-parallel training under msrun, which launches a script file, not a module:

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True pipeline/msrun_entry.py \\
        --shards runs/x/shards --config my-config.yaml --out runs/x/train

Each process runs `corpusmill train ARGS`; its rank comes from MindSpore's communication layer and
it reads that rank's share of the shards; gradients are all-reduced every step. It lives in
`pipeline/` because it starts the command line; `trainer/` never imports upwards.
"""
import os
import sys

if __name__ == "__main__":
    # run as a script, Python puts this folder first on sys.path, where pipeline/'s modules (config,
    # steps, service, ...) would shadow top-level packages of the same name: the checkout holding the
    # `pipeline` package goes there instead
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        sys.path[0] = os.path.dirname(here)

    from corpusmill.pipeline.cli import main

    sys.exit(main(["train", *sys.argv[1:]]))
