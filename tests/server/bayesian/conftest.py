"""The designer runs in the test process (no child process): one torch thread, as in the server's
child process on a small machine, so tests do not oversubscribe the cores."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
