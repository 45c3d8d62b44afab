"""PPO under torchrun (or any launcher that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).

Every rank runs this script. Rank 0 trains; ranks 1..WORLD_SIZE-1 each serve one collector
inside the ``RPCCollector`` constructor and exit with code 0 when the trainer shuts down.
The training code is ``examples/ppo.py``'s, unchanged:

    torchrun --nnodes 1 --nproc-per-node 3 examples/torchrun_train.py --total-frames 100000
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        examples/torchrun_train.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when a launcher runs this file with runpy
from ppo import main  # noqa: E402  (examples/ppo.py)

if __name__ == "__main__":
    raise SystemExit(main(["--launcher", "torchrun", *sys.argv[1:]]))
