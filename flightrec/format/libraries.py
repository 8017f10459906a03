"""Which source files are library code, not the job's own: one definition for the recorder (which call
site an op is placed at) and the analyzer (which frame of a stack a report names).

Why: an FSDP2 op is issued from a hook inside torch, under a `torch.no_grad` decorator; the frame that
called torch.distributed is `torch/utils/_contextlib.py`, the same for every op of the job. The line an
on-call engineer acts on is the first frame of the user's code outside every library (`model(x)`).
Only the standard library: the recorder must not import more, and the analyzer imports this too.
"""

from __future__ import annotations

import re

# Packages whose frames are never the user's code, wherever they are installed (a source checkout of
# torch or Megatron-LM is not under site-packages).
LIBRARY_PACKAGES = (
    "torch", "torchvision", "torchaudio", "torchtext", "functorch", "triton", "deepspeed", "megatron", "accelerate",
    "lightning", "pytorch_lightning", "lightning_fabric", "transformers", "peft", "trl", "fairscale", "apex",
    "colossalai", "composer", "nemo", "flightrec",
)
LIBRARY = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]"  # anything installed
    r"|[/\\]lib[/\\]python\d[\d.]*[/\\]"  # the standard library
    r"|^<frozen "  # frozen standard modules
    r"|(?:^|[/\\])(?:" + "|".join(LIBRARY_PACKAGES) + r")[/\\]"
)


def is_library_file(filename: str) -> bool:
    """True for a file of an installed package, the standard library, a known framework or flightrec."""
    return LIBRARY.search(filename) is not None
