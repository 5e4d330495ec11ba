"""Entry script for data-parallel training under msrun, which launches a script file, not a module:

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --join=True trainer/msrun_entry.py \\
        --shards runs/x/shards --config my-config.yaml --out runs/x/train

Each process runs `corpusmill train ARGS`; its rank comes from MindSpore's communication layer and
it reads that rank's share of the shards; gradients are all-reduced every step.
"""
import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
