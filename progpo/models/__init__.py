"""Model builders (one Hydra component per ``conf/model/*.yaml``), all returning a ``Policy``.

Builders are imported from their modules by Hydra (``progpo.warmstart.tiny.build_tiny`` and so on); this
package only exposes the shared types, so importing it does not pull in tokenizers training or peft.
"""

from progpo.models.logprobs import LogProbOutput, TokenBatch, forward_logprobs, pad_prompt_response
from progpo.models.policy import make_reference

__all__ = [
    "LogProbOutput",
    "TokenBatch",
    "forward_logprobs",
    "make_reference",
    "pad_prompt_response",
]
