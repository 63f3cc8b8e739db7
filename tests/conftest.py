"""Test-wide settings."""

import torch

# Tests run many small tensor ops; one intra-op thread avoids oversubscribing a 2-core machine (much faster here
# and deterministic across machines).
torch.set_num_threads(1)
