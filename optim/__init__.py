"""FreeScale optimizer: sample balancing (``optim.balance``); numpy only at import time."""
