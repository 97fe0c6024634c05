"""What stream-skew and head-chain share: the stages of Tuesday's CNN they read, and their setup (512
MNIST digits through the nets of five seeds).
"""

from __future__ import annotations

STAGES = ["stem", "pool1", "block1", "pool2", "block2", "block3"]

NET_SETUP = {"batch": 512, "pool": "max", "seeds": [0, 1, 2, 3, 4]}
NET_QUICK = {"batch": 256, "seeds": [0, 1, 2]}
